"""`roformer push`: share a model directory on the Hugging Face hub, with a model card written from its run.

The folder uploaded is the model directory (model.yaml, model.safetensors, tokenizer files), an `hf/` export where
transformers can express the model (so `from_pretrained(repo, subfolder="hf")` works without this package), and a
README.md card: architecture and position encoding, the run's config, data, steps and tokens, final eval loss and
accuracy, a GLUE dev table when one is given, and how to load it. `--dry-run DIR` writes exactly that folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from roformer.config import read_yaml
from roformer.errors import CheckpointError, UserError
from roformer.study.outputs import SUITE_TABLE_FILE
from roformer.train.run_dir import METRICS_FILE, RUN_CONFIG_FILE, read_metrics
from roformer.version import DISTRIBUTION

CARD_FILE = "README.md"
HF_SUBFOLDER = "hf"


def write_upload_folder(model_dir: Path, target: Path, repo_id: str, glue_dir: Path | None = None) -> list[str]:
    """Write into `target` what `push` uploads; returns the file names (relative, sorted)."""
    from roformer.data.tokenizer import copy_tokenizer_files
    from roformer.model.hf import to_hf
    from roformer.model.model import load

    model = load(model_dir)  # also checks the directory (one-line CheckpointError)
    for path in model_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, target / path.name)
    try:
        hf_model = to_hf(model)
    except CheckpointError as e:
        hf_reason = str(e)
    else:
        hf_reason = None
        hf_model.save_pretrained(target / HF_SUBFOLDER)
        copy_tokenizer_files(model_dir, target / HF_SUBFOLDER)
    card = model_card(model, model_dir, repo_id, hf_reason, glue_dir)
    (target / CARD_FILE).write_text(card, encoding="utf-8")
    return sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())


def model_card(model: Any, model_dir: Path, repo_id: str, hf_reason: str | None, glue_dir: Path | None) -> str:
    """The README.md of the hub repository, from the model and (when `model_dir` is a run's final/) its run."""
    config = model.config
    run = model_dir.parent
    metrics = read_metrics(run / METRICS_FILE) if (run / METRICS_FILE).is_file() else []
    train = [e for e in metrics if e.get("event") == "train"]
    evals = [e for e in metrics if e.get("event") == "eval" and "eval_loss" in e]
    run_config = read_yaml(run / RUN_CONFIG_FILE) if (run / RUN_CONFIG_FILE).is_file() else None
    shape = (
        f"{config.num_layers} layers x {config.hidden_size}, {config.num_heads} heads, FFN {config.intermediate_size}"
    )
    lines = [
        "---",
        f"library_name: {DISTRIBUTION}",
        f"tags: [roformer, {config.position_encoding}, {model.architecture.replace('_', '-')}]",
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
    if train:
        last = train[-1]
        lines.append(f"- steps: {last['step']:,}; tokens: {last.get('tokens_seen', 0):,}")
    if evals:
        final = evals[-1]
        accuracy = f", masked-token accuracy {100 * final['eval_accuracy']:.1f}%" if "eval_accuracy" in final else ""
        lines.append(f"- final eval loss (held-out text): {final['eval_loss']:.3f}{accuracy} at step {final['step']:,}")
    if run_config is not None:
        data = run_config.get("data", {})
        source = ", ".join(map(str, data.get("paths") or [])) or data.get("source", "-")
        lines.append(f"- data: {source}; max sequence length {data.get('max_seq_len', '-')}")
        lines += ["", "The run's config:", "", "```yaml", _yaml(run_config).rstrip(), "```"]
    if not train and run_config is None:
        lines.append(f"- no run directory next to `{model_dir.name}`: training details unknown")
    if glue_dir is not None:
        table = glue_dir / SUITE_TABLE_FILE
        if not table.is_file():
            raise UserError(f"--glue {glue_dir}: no {SUITE_TABLE_FILE} (the output directory of `roformer glue`)")
        _check_glue_init(glue_dir, model_dir)
        lines += ["", "## GLUE (dev)", "", table.read_text(encoding="utf-8").strip()]
    lines += _usage(repo_id, model.architecture, hf_reason)
    return "\n".join(lines) + "\n"


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


def _usage(repo_id: str, architecture: str, hf_reason: str | None) -> list[str]:
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
    if hf_reason is not None:
        return lines + [f"transformers cannot load this model: {hf_reason}."]
    auto = {"masked_lm": "AutoModelForMaskedLM", "causal_lm": "AutoModelForCausalLM"}.get(architecture, "AutoModel")
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

    Raises:
        UserError: no token, or the hub cannot be reached or refuses (one line, with the hub's reason).
    """
    import huggingface_hub

    api = huggingface_hub.HfApi(token=hub_token(token))
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=f"Upload with {DISTRIBUTION}")
    except Exception as e:  # connection errors, offline mode, 401/403/404: all one line
        reason = " ".join(str(e).split())[:300]
        raise UserError(f"could not upload to the hub ({type(e).__name__}: {reason})") from None
    return str(url)
