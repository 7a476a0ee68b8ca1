"""`roformer push`: share a model directory on the Hugging Face hub, with a model card written from its run.

The folder uploaded is the model directory (model.yaml, model.safetensors, tokenizer files), an `hf/` export where
transformers can express the model (so `from_pretrained(repo, subfolder="hf")` works without this package), and a
README.md card: architecture and position encoding, the run's config, data, steps and tokens, final eval loss and
accuracy, a GLUE dev table when one is given, and how to load it. `--dry-run DIR` writes exactly that folder.

A fine-tuned model (a run's best/) is described by the run selected from its learning rate x seed grid. No local
path is published: the card shows `<local>/NAME` for each, JSON metadata is scrubbed alike, and a file that still
names the home or working directory or the run is refused.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from roformer.config_yaml import read_yaml
from roformer.errors import CheckpointError, UserError
from roformer.files import stop_on_write_failure
from roformer.logs import quiet_loggers
from roformer.study.outputs import SUITE_TABLE_FILE
from roformer.train.run_dir import BEST_DIR, METRICS_FILE, RESULTS_FILE, RUN_CONFIG_FILE, read_metrics
from roformer.version import DISTRIBUTION

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
HF_SUBFOLDER = "hf"
LOCAL = "<local>"  # stands for the folders of a local path in the card: only its last part is published
# Loggers that write one INFO line per HTTP request, which the CLI's INFO level would print during an upload.
HTTP_LOGGERS = ("httpx", "httpcore", "huggingface_hub")
# The transformers class that loads each architecture's hf/ export with its head (AutoModel would drop a fine-tuned
# classifier); a backbone loads with AutoModel.
AUTO_CLASSES = {
    "masked_lm": "AutoModelForMaskedLM",
    "causal_lm": "AutoModelForCausalLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "question_answering": "AutoModelForQuestionAnswering",
    "multiple_choice": "AutoModelForMultipleChoice",
}
KEPT = "nothing was uploaded"  # what a failed write of the upload folder leaves intact
# Files of a tokenizer's vocabulary: a token may look like a path ("/usr"), so they are neither scrubbed nor checked.
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt")


class InvalidRepoId(UserError):
    """`--repo-id` is not a hub repository id; found before anything is built or written."""


def check_repo_id(repo_id: str) -> None:
    """Refuse a repository id the hub would refuse (`a/b/c`, `""`, `../x`), with huggingface_hub's own rules.

    Raises:
        InvalidRepoId: one line, with the validator's reason.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        reason = " ".join(str(e).split()).replace(" Use `repo_type` argument if needed.", "")
        raise InvalidRepoId(
            f"--repo-id {repo_id!r} is not a hub repository id (NAME or NAMESPACE/NAME, e.g. you/roformer-small): "
            f"{reason}"
        ) from None


def write_upload_folder(model_dir: Path, target: Path, repo_id: str, glue_dir: Path | None = None) -> list[str]:
    """Write into `target` what `push` uploads; returns the file names (relative, sorted).

    The repository id, the model and the card's inputs are checked before anything is written. A model without a
    tokenizer is written with a one-line warning (and the card says so): it can be uploaded, but nobody can feed
    it text without the tokenizer it was trained with.

    Raises:
        InvalidRepoId: `repo_id` is not a hub repository id (checked first).
        CheckpointError: `model_dir` is not a model directory.
        UserError: a `--glue` directory that is not this model's, or a local path left in a file to upload.
        WriteFailed: a write failed (disk full, read-only disk), naming the file (exit code 74).
    """
    from roformer.data.tokenizer import copy_tokenizer_files
    from roformer.model.hf import to_hf
    from roformer.model.model import load

    check_repo_id(repo_id)  # first: nothing is built for a repository that cannot exist
    model = load(model_dir)  # also checks the directory (one-line CheckpointError)
    try:
        hf_model = to_hf(model)
    except CheckpointError as e:
        hf_model, hf_reason = None, str(e)
    else:
        hf_reason = None
    card = model_card(model, model_dir, repo_id, hf_reason, glue_dir)  # before writing: its refusals write nothing
    if not _has_tokenizer(model_dir):
        logger.warning(
            "%s has no tokenizer (%s): the repository will hold a model nobody can feed text to",
            model_dir,
            " or ".join(VOCABULARY_FILES),
        )
    # A failed write (disk full) is one line naming the file and exit code 74, not a traceback. In a staged DIR
    # (roformer.files.staged_output_dir) the message names DIR and the file in it; DIR is left as it was.
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            with stop_on_write_failure(target / path.name, KEPT):
                shutil.copy2(path, target / path.name)
    with stop_on_write_failure(target / CARD_FILE, KEPT):
        (target / CARD_FILE).write_text(card, encoding="utf-8")
    if hf_model is not None:  # last: a failed small write ends in one line, before any progress bar
        with stop_on_write_failure(target / HF_SUBFOLDER, KEPT):
            hf_model.save_pretrained(target / HF_SUBFOLDER)
            copy_tokenizer_files(model_dir, target / HF_SUBFOLDER)
    for path in sorted(target.rglob("*.json")):
        with stop_on_write_failure(path, KEPT):
            _scrub_json(path)
    _check_no_local_path(target, model_dir)
    return sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())


def _has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / name).is_file() for name in VOCABULARY_FILES)


def is_local_path(text: str) -> bool:
    """True for an absolute or home-relative path of this machine; False for a hub name (`user/model`) or a URL."""
    return text.startswith(("/", "~", "\\\\")) or re.match(r"[A-Za-z]:[\\/]", text) is not None


def public(value: Any) -> Any:
    """`value` (a config, a list, a string) with every local path replaced by `<local>/` and its last part."""
    if isinstance(value, dict):
        return {key: public(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [public(item) for item in value]
    if isinstance(value, str) and is_local_path(value):
        name = re.split(r"[\\/]", value.rstrip("/\\"))[-1]
        return f"{LOCAL}/{name or '-'}"
    return value


def _scrub_json(path: Path) -> None:
    """Replace local paths in a JSON metadata file (transformers may record `name_or_path`); rewritten if any."""
    if path.name in VOCABULARY_FILES:
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):  # not ours to read: _check_no_local_path still looks at it
        return
    scrubbed = public(data)
    if scrubbed != data:
        path.write_text(json.dumps(scrubbed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_no_local_path(target: Path, model_dir: Path) -> None:
    """No uploaded text file names the home or working directory or the model's run: they are not published.

    The card and the JSON files are scrubbed; this catches what scrubbing cannot know of (a path inside a value,
    a file of the model directory in another format).

    Raises:
        UserError: naming the file and the path found in it.
    """
    folders = {Path.home(), Path.cwd(), model_dir.resolve().parent}
    markers = sorted((str(p) for p in folders if len(p.parts) > 1), key=len, reverse=True)
    # a whole path: /root must match neither /rootfs, /data/root nor a scrubbed <local>/root
    pattern = re.compile("|".join(f"(?<![\\w.>~-]){re.escape(m)}(?![\\w.-])" for m in markers))
    for path in sorted(target.rglob("*")):
        if not path.is_file() or path.name in VOCABULARY_FILES or path.suffix == ".safetensors":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary: no text path to read
            continue
        found = pattern.search(text)
        if found:
            name = path.relative_to(target)
            source = "the run's files" if name == Path(CARD_FILE) else model_dir / name
            raise UserError(f"{name} would publish the local path {found.group()}: remove it from {source}")


def model_card(model: Any, model_dir: Path, repo_id: str, hf_reason: str | None, glue_dir: Path | None) -> str:
    """The README.md of the hub repository, from the model and (a run's final/ or best/) its run.

    Local paths appear as `<local>/NAME`. A fine-tuned model (a run's best/) is described by its selected run: its
    task, learning rate and seed, steps, tokens and dev scores, and the max sequence length it was trained with.
    """
    config = model.config
    run = model_dir.parent
    metrics = read_metrics(run / METRICS_FILE) if (run / METRICS_FILE).is_file() else []
    run_config = read_yaml(run / RUN_CONFIG_FILE) if (run / RUN_CONFIG_FILE).is_file() else None
    results = _finetune_results(model_dir)
    shape = (
        f"{config.num_layers} layers x {config.hidden_size}, {config.num_heads} heads, FFN {config.intermediate_size}"
    )
    tags = ["roformer", config.position_encoding, model.architecture.replace("_", "-")]
    if results is not None:
        tags += ["glue", str(results["task"])]
    lines = [
        "---",
        f"library_name: {DISTRIBUTION}",
        f"tags: [{', '.join(tags)}]",
        "---",
        "",
        f"# {repo_id.split('/')[-1]}",
        "",
        f"A `{model.architecture}` model with **{config.position_encoding}** position encoding ({shape}, vocabulary "
        f"{config.vocab_size}, {model.num_parameters():,} parameters), trained with [{DISTRIBUTION}]"
        f"(https://pypi.org/project/{DISTRIBUTION}/) (import name `roformer`).",
        "",
        "## Training",
        "",
    ]
    if results is not None:
        lines += _finetune_lines(results, metrics, run_config)
    else:
        lines += _pretrain_lines(metrics, run_config)
    if run_config is not None:
        shown = public(run_config)
        lines += ["", "The run's config:", "", "```yaml", _yaml(shown).rstrip(), "```"]
        if shown != run_config:
            lines += ["", f"Local paths are shown as `{LOCAL}/NAME`: their last part only, the rest is not published."]
    if not metrics and run_config is None:
        lines.append(f"- no run directory next to `{model_dir.name}`: training details unknown")
    if glue_dir is not None:
        table = glue_dir / SUITE_TABLE_FILE
        if not table.is_file():
            raise UserError(f"--glue {glue_dir}: no {SUITE_TABLE_FILE} (the output directory of `roformer glue`)")
        _check_glue_init(glue_dir, model_dir)
        lines += ["", "## GLUE (dev)", "", table.read_text(encoding="utf-8").strip()]
    lines += _usage(repo_id, model.architecture, hf_reason, _has_tokenizer(model_dir))
    return "\n".join(lines) + "\n"


def _pretrain_lines(metrics: list[dict[str, Any]], run_config: dict[str, Any] | None) -> list[str]:
    """Steps, tokens, final eval loss and data of a pretraining run."""
    lines = []
    train = [e for e in metrics if e.get("event") == "train"]
    evals = [e for e in metrics if e.get("event") == "eval" and "eval_loss" in e]
    if train:
        last = train[-1]
        lines.append(f"- steps: {last['step']:,}; tokens: {last.get('tokens_seen', 0):,}")
    if evals:
        final = evals[-1]
        accuracy = f", masked-token accuracy {100 * final['eval_accuracy']:.1f}%" if "eval_accuracy" in final else ""
        lines.append(f"- final eval loss (held-out text): {final['eval_loss']:.3f}{accuracy} at step {final['step']:,}")
    if run_config is not None:
        data = run_config.get("data") or {}
        source = ", ".join(map(str, public(data.get("paths") or []))) or data.get("source", "-")
        lines.append(f"- data: {source}; max sequence length {data.get('max_seq_len', '-')}")
    return lines


def _finetune_results(model_dir: Path) -> dict[str, Any] | None:
    """The results.json of the fine-tuning run whose selected model `model_dir` is (its best/), else None."""
    results = model_dir.parent / RESULTS_FILE
    if model_dir.name != BEST_DIR or not results.is_file():
        return None
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{results}: damaged or unreadable ({type(e).__name__}: {e})") from None
    return data if isinstance(data, dict) and "selected" in data and "task" in data else None


def _finetune_lines(
    results: dict[str, Any], metrics: list[dict[str, Any]], run_config: dict[str, Any] | None
) -> list[str]:
    """Task, selected run, its steps, tokens and dev scores, data and max sequence length of a fine-tuning run.

    Everything is the selected run's (best/ holds its weights): metrics.jsonl and results.json hold every run of
    the learning rate x seed grid, tagged with `peak_lr` and `seed`.
    """
    selected = results["selected"]
    lr, seed, fold = selected["peak_lr"], selected["seed"], selected.get("fold")

    def chosen(entry: dict[str, Any]) -> bool:
        return entry.get("peak_lr") == lr and entry.get("seed") == seed and entry.get("fold") == fold

    runs = results.get("runs") or []
    record = next((r for r in runs if chosen(r)), {})
    train = [e for e in metrics if e.get("event") == "train" and chosen(e)]
    split = results.get("selection_split", "dev")
    init = public(results.get("init") or (run_config or {}).get("init") or "-")
    label = f" ({results['label']})" if results.get("label") else ""
    lines = [f"- task: {results['task']} (GLUE){label}, fine-tuned from `{init}`"]
    lrs, seeds = len({r["peak_lr"] for r in runs}), len({r["seed"] for r in runs})
    grid = f"{_count(lrs, 'learning rate')} x {_count(seeds, 'seed')}"
    held_out = ""
    if fold is not None:  # a cross-validated task: its dev split is the held-out fold of the training file
        grid += f" x {_count(len({r.get('fold') for r in runs}), 'fold')}"
        held_out = f", held-out fold {fold}"
    lines.append(
        f"- selected run: peak learning rate {lr:g}, seed {seed}{held_out}, of {_count(len(runs), 'run')} ({grid}): "
        f"the learning rate with the best mean {split} score, then its best run"
    )
    steps = record.get("steps", train[-1]["step"] if train else "-")
    tokens = train[-1].get("tokens_seen", 0) if train else "-"
    best = selected.get("best_step", record.get("best_step"))
    at_best = f"; the weights are those of step {best:,}, its best {split} score" if isinstance(best, int) else ""
    lines.append(f"- steps: {_thousands(steps)}; tokens: {_thousands(tokens)} (the selected run{at_best})")
    for name, scores in (record.get("dev") or {}).items():
        shown = [m for m in scores if not (m == "score" and len(scores) == 2)]  # one metric: its score is the same
        text = ", ".join(f"{m} {_percent(scores[m])}" for m in shown)
        summary = (results.get("summary") or {}).get(name, {}).get("score", {})
        if len(summary.get("values", [])) > 1:  # the best seed alone flatters: the spread over seeds says how much
            text += (
                f" (score over this learning rate's {len(summary['values'])} {'runs' if held_out else 'seeds'}: "
                f"{_percent(summary['mean'])} ± "
                f"{_percent(summary['std'])})"
            )
        lines.append(f"- {name} scores of the selected run: {text}")
    data = (run_config or {}).get("data") or {}
    if run_config is not None or "max_length" in results:
        length = results.get("max_length")
        if length is None:  # results written before the length used was recorded
            length = f"at most {data.get('max_length', '-')} (configured; capped at the pretraining length)"
        lines.append(f"- data: {_glue_source(data)}; max sequence length {length}")
    return lines


def _glue_source(data: dict[str, Any]) -> str:
    """Where a fine-tuning config's examples came from, local paths by name only."""
    source = data.get("source", "-")
    if source == "files":
        keys = ("train_file", "validation_file", "test_file", "validation_mismatched_file", "test_mismatched_file")
        return "files " + ", ".join(str(public(data[k])) for k in keys if data.get(k))
    if source == "glue_dir":
        return f"GLUE files in {public(data.get('glue_dir') or '-')}"
    if source == "hub":
        return f"the hub dataset {data.get('hub_name', '-')}"
    return str(source)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _thousands(value: Any) -> str:
    """An integer with thousands separators (`12,345`); anything else as text."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def _percent(value: Any) -> str:
    return f"{100 * value:.2f}" if isinstance(value, int | float) else str(value)


def _check_glue_init(glue_dir: Path, model_dir: Path) -> None:
    """Every task of a `roformer glue` output directory fine-tuned `model_dir` (its config.yaml's `init`).

    Raises:
        UserError: a task whose init is another model: its scores would be published as this model's.
    """
    for task_config in sorted(glue_dir.glob(f"*/{RUN_CONFIG_FILE}")):
        init = (read_yaml(task_config) or {}).get("init")
        if init and Path(init).resolve() != model_dir.resolve():
            raise UserError(
                f"--glue {glue_dir}: {task_config.parent.name} fine-tuned {init}, not {model_dir}: its scores are "
                "another model's"
            )


def _usage(repo_id: str, architecture: str, hf_reason: str | None, tokenizer: bool = True) -> list[str]:
    lines = [
        "",
        "## Use",
        "",
        "```python",
        "from huggingface_hub import snapshot_download",
        "import roformer",
        "",
        f'model = roformer.load(snapshot_download("{repo_id}"))  # pip install {DISTRIBUTION}',
        "```",
        "",
    ]
    if not tokenizer:
        lines += [
            "This repository has no tokenizer (no tokenizer.json or vocab.txt was saved with the model): text must be "
            "tokenized with the vocabulary it was trained on, which is not published here.",
            "",
        ]
    if hf_reason is not None:
        return lines + [f"transformers cannot load this model: {hf_reason}."]
    auto = AUTO_CLASSES.get(architecture, "AutoModel")
    return lines + [
        "With transformers alone (the `hf/` folder):",
        "",
        "```python",
        f"from transformers import {auto}",
        "",
        f'model = {auto}.from_pretrained("{repo_id}", subfolder="{HF_SUBFOLDER}")',
        "```",
    ]


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def hub_token(token: str | None) -> str:
    """The token to upload with: the one given, else HF_TOKEN or the saved login.

    Raises:
        UserError: there is none (checked before any work).
    """
    import huggingface_hub

    token = token or huggingface_hub.get_token()
    if not token:
        raise UserError("no Hugging Face token: run `hf auth login`, set HF_TOKEN or pass --token")
    return token


def push(folder: Path, repo_id: str, token: str | None, private: bool) -> str:
    """Upload `folder` to the model repository `repo_id` (created if missing); returns its URL.

    HTTP request logging is silenced meanwhile: the CLI logs at INFO, where httpx and huggingface_hub print a line
    per request.

    Raises:
        InvalidRepoId: `repo_id` is not a hub repository id.
        UserError: no token, or the hub cannot be reached or refuses (one line, with the hub's reason).
    """
    import huggingface_hub

    check_repo_id(repo_id)
    api = huggingface_hub.HfApi(token=hub_token(token))
    try:
        with quiet_http_logging():
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=f"Upload with {DISTRIBUTION}")
    except Exception as e:  # connection errors, offline mode, 401/403/404: all one line
        reason = " ".join(str(e).split())[:300]
        raise UserError(f"could not upload to the hub ({type(e).__name__}: {reason})") from None
    return str(url)


def quiet_http_logging() -> AbstractContextManager[None]:
    """The HTTP loggers (HTTP_LOGGERS) at WARNING for the block.

    Their INFO lines ("HTTP Request: POST ...", one per request and file) would bury the command's own output;
    warnings and errors still show.
    """
    return quiet_loggers(*HTTP_LOGGERS)
