"""`roformer eval-mlm`: masked-token loss and accuracy of a pretrained model at several sequence lengths.

The validation documents of a pretraining config (or of a run's own config.yaml) are tokenized once with the
model's own tokenizer, packed into blocks of each length and scored under the fixed evaluation mask (seeded as in
training); the training split is never read beyond what the validation split needs. The same
number of tokens is scored at every length (`max_tokens`, or, when the validation text is shorter, what it fills at
every length; up to one block of the length), so the lengths differ only in context. Rotary and
sinusoidal positions and the relative baselines (Shaw's clipped distances, T5's last bucket, ALiBi's linear bias) run
at any length; learned positions stop at their table, which is reported, not crashed on.

`rope_scalings` evaluates a rotary model under context-scaling methods (ModelConfig.rope_scaling): `none` (the
paper's RoPE), `linear` (position interpolation), `ntk`, `yarn`, each with a fixed factor (`yarn:4`) or, by
default, factor = length / trained length at every length longer than the trained one (the factor a user would
choose to run at that length); `self_extend` (SelfExtend's grouped positions beyond a window of half the trained
length) with a group size (`self_extend:4`) or, by default, the smallest that keeps every distance within the
trained length. The weights are the same; only the rotation tables change. A row is `as_trained`
when its tables are the model's own (`none` for a model trained without scaling): those are what compare reads.

The results are rows of numbers (written as JSON by `write_results`); roformer.study.markdown.length_results_table
lays them out as the table eval-mlm prints. `run_length_eval` is the command: its checks (before any work), the
evaluation and the results file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

import roformer.config
from roformer.catalogue import find_config
from roformer.data.corpus import validation_documents
from roformer.data.mlm import eval_batch
from roformer.data.packing import pack_blocks, tokenize_documents
from roformer.data.tokenizer import check_fits, jieba_presegmenter, load_tokenizer
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text, check_output_file
from roformer.model.config import ModelConfig
from roformer.model.model import Model, load
from roformer.model.positions import rotary_frequencies
from roformer.tasks.extensions import Extension
from roformer.train.config import PretrainConfig
from roformer.train.evaluate import evaluate_mlm
from roformer.train.run_dir import FINAL_DIR, LENGTH_FILE, RUN_CONFIG_FILE, pretraining_length

logger = logging.getLogger(__name__)


def data_config_of(source: str | Path) -> Any:
    """The `data` section of a pretraining config file or of a run directory's config.yaml.

    Raises:
        UserError: neither a config file nor a run directory.
    """
    path = Path(source)
    if path.is_dir():
        path = path / RUN_CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{source}: neither a pretraining config nor a run directory with {RUN_CONFIG_FILE}")
    return roformer.config.load(PretrainConfig, path).data


def default_device() -> str:
    """`cuda` where this machine has a CUDA device, else `cpu`: where eval-mlm and experiments' length stage run."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(name: str) -> None:
    """Refuse a device this machine cannot run on: a name torch does not know, or a device it does not have.

    Raises:
        UserError: one line, naming the device and torch's reason.
    """
    try:
        torch.zeros(1, device=torch.device(name)).cpu()  # allocates: a missing device or device index fails here
    except Exception as e:  # RuntimeError (unknown name, bad index), AssertionError (torch built without it), ...
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"--device {name!r}: not a device this machine can run on ({reason})") from None


SCALING_METHODS = ("none", "linear", "ntk", "yarn", "self_extend")


def parse_rope_scalings(text: str) -> list[tuple[str, float | None]]:
    """`none,linear,yarn:4` -> [("none", None), ("linear", None), ("yarn", 4.0)] (None: length / trained length).

    Only the text is read here; which methods and factors are valid is `LengthEvalSettings`'s check.

    Raises:
        UserError: a factor that is not a number.
    """
    methods: list[tuple[str, float | None]] = []
    for item in text.split(","):
        if item.strip() == "none":
            methods.append(("none", None))
            continue
        try:
            extension = Extension.parse(item)  # the lab's reading of a method and its factor
        except ConfigError as e:
            raise UserError(f"--rope-scaling: {e}") from None
        methods.append((extension.method, extension.factor))
    return methods


def scaled(model: Model, method: str, factor: float | None, length: int, trained: int) -> tuple[Model, str]:
    """`model` with the rotation tables of `method` for evaluating at `length` (same weights), and a label."""
    scaling = None if method == "none" else Extension(method, factor).rope_scaling(length, trained)
    config = dataclasses.replace(model.config, rope_scaling=scaling)
    copy = type(model)(config)
    copy.load_state_dict(model.state_dict())
    parameter = next(model.parameters())
    label = "none" if scaling is None else f"{method} x{scaling.factor:g}"
    return copy.to(parameter.device).eval(), label


def same_tables(a: ModelConfig, b: ModelConfig) -> bool:
    """Two rotary configs rotate alike: equal inverse frequencies and magnitude (not necessarily equal fields)."""
    freq_a, scale_a = rotary_frequencies(a.rotary_size, a.rotary_base, a.rope_scaling)
    freq_b, scale_b = rotary_frequencies(b.rotary_size, b.rotary_base, b.rope_scaling)
    return scale_a == scale_b and torch.equal(freq_a, freq_b)


@dataclasses.dataclass(frozen=True)
class LengthEvalSettings:
    """What eval-mlm measures, checked on construction (the command's flags and an experiment's `length:`).

    Attributes:
        seq_lens: Block lengths (>= 8).
        max_tokens: Tokens scored at every length.
        batch_size: Blocks per forward.
        rope_scalings: (method, factor) pairs (`parse_rope_scalings`; factor None: length / trained length); None =
            the model as saved.
        trained_length: The length the model was trained at, for the factors (None: its pretraining.json).
    """

    seq_lens: tuple[int, ...]
    max_tokens: int = 65536
    batch_size: int = 8
    rope_scalings: tuple[tuple[str, float | None], ...] | None = None
    trained_length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_lens", tuple(self.seq_lens))  # lists from YAML and the parsers: fixed
        if self.rope_scalings is not None:
            object.__setattr__(self, "rope_scalings", tuple((m, f) for m, f in self.rope_scalings))
        if not self.seq_lens or min(self.seq_lens) < 8:
            raise ConfigError(f"seq_lens: lengths must be >= 8, got {list(self.seq_lens)}")
        if self.max_tokens < 1 or self.batch_size < 1:
            raise ConfigError(f"max_tokens and batch_size must be >= 1, got {self.max_tokens}, {self.batch_size}")
        for method, factor in self.rope_scalings or ():
            if method not in SCALING_METHODS:
                raise ConfigError(f"rope_scaling: unknown method {method!r} (known: {', '.join(SCALING_METHODS)})")
            if factor is not None and (factor < 1 or method == "none"):
                raise ConfigError(
                    f"rope_scaling: {method}:{factor:g}: a factor >= 1 goes with linear, ntk, yarn or self_extend"
                )
        if self.trained_length is not None and self.trained_length < 1:
            raise ConfigError(f"trained_length must be >= 1, got {self.trained_length}")


def evaluate_lengths(
    model_dir: str | Path, data_source: str | Path, settings: LengthEvalSettings, device: str = "cpu"
) -> list[dict[str, Any]]:
    """One result per length (and scaling method): eval_loss, eval_accuracy, blocks and masked tokens.

    A length the model cannot take (learned positions beyond their table) gets an `error` entry instead.

    Args:
        model_dir: The model to evaluate.
        data_source: A pretraining config or run directory whose validation split is scored.
        settings: The lengths, token budget, batch size and scalings.
        device: Where to run (checked first: `check_device`).

    Raises:
        UserError: a bad model, data source, or scaling of a model without rotary positions.
    """
    check_device(device)
    model_dir = Path(model_dir)
    model = load(model_dir, architecture="masked_lm", device=device)
    trained_length = settings.trained_length
    if settings.rope_scalings is not None:
        if model.config.position_encoding != "rotary":
            raise UserError(f"--rope-scaling: {model_dir} has {model.config.position_encoding} positions, not rotary")
        trained_length = trained_length or pretraining_length(model_dir)
        if trained_length is None:
            raise UserError(f"--rope-scaling: {model_dir} does not record its training length; pass --trained-length")
    data = data_config_of(data_source)
    tokenizer = load_tokenizer(model_dir, split_cjk=not data.jieba)
    check_fits(tokenizer, model.config.vocab_size, model_dir)
    transform = jieba_presegmenter(tokenizer) if data.jieba else None  # the vocabulary's words whole
    token_lists = tokenize_documents(validation_documents(data), tokenizer, data.num_proc, transform)
    packed: dict[int, Any] = {}  # length -> its blocks, or the reason it cannot be scored
    config = model.config
    for length in settings.seq_lens:
        if not config.holds_positions(length):
            message = f"learned positions cover {config.max_position_embeddings} tokens; cannot evaluate {length}"
            logger.warning("%s: %s", model_dir, message)
            packed[length] = message
            continue
        try:
            packed[length] = pack_blocks(token_lists, length, tokenizer.cls_token_id, tokenizer.sep_token_id)
        except UserError as e:  # the validation text is shorter than one block of this length
            packed[length] = f"validation split: {e}"
    # one budget for every length: max_tokens, or what the validation text fills at every length when it is shorter
    # (its tail would otherwise be scored at the short lengths only)
    filled = [len(blocks) * length for length, blocks in packed.items() if not isinstance(blocks, str)]
    budget = min([settings.max_tokens, *filled])
    results = []
    for length in settings.seq_lens:
        if isinstance(packed[length], str):
            results.append({"seq_len": length, "error": packed[length]})
            continue
        blocks = packed[length][: max(1, budget // length)]
        ids, labels = eval_batch(blocks, tokenizer, data)
        if settings.rope_scalings is None:
            scores = evaluate_mlm(model, ids, labels, settings.batch_size, torch.device(device))
            results.append({"seq_len": length, "blocks": len(blocks), **scores})
            continue
        for method, factor in settings.rope_scalings:
            variant, label = scaled(model, method, factor, length, trained_length)
            scores = evaluate_mlm(variant, ids, labels, settings.batch_size, torch.device(device))
            as_trained = same_tables(variant.config, model.config)  # what compare reads as the model
            row = {"seq_len": length, "rope_scaling": label, "as_trained": as_trained, "blocks": len(blocks)}
            row["column"] = method if factor is None else label  # the printed table's column
            results.append({**row, **scores})
    return results


def default_output(model_dir: str | Path) -> Path:
    """`<run>/length_extrapolation.json` for a run's final/ (where compare finds it), else inside the model dir."""
    model_dir = Path(model_dir)
    if model_dir.name == FINAL_DIR and (model_dir.parent / RUN_CONFIG_FILE).is_file():
        return model_dir.parent / LENGTH_FILE
    return model_dir / LENGTH_FILE


def write_results(path: Path, model_dir: str | Path, results: list[dict[str, Any]]) -> None:
    """Write the results JSON (atomically)."""
    atomic_write_text(path, json.dumps({"model": str(model_dir), "results": results}, indent=2))


def run_length_eval(
    model_dir: str | Path,
    data: str | None,
    settings: LengthEvalSettings,
    out: str | Path | None = None,
    overwrite: bool = False,
    device: str | None = None,
) -> tuple[list[dict[str, Any]], Path]:
    """`roformer eval-mlm`: check the request, evaluate every length, write the results file.

    Everything that can be checked without the model is checked before it is loaded: the model directory, the
    results file (writable, not replaced unless `overwrite`) and the data source (the settings check themselves).

    Args:
        model_dir: The model to evaluate.
        data: A pretraining config (a path or a shipped config's name) or run directory; None = the model's own run
            when `model_dir` is a run's final/.
        settings: The lengths, token budget, batch size and scalings.
        out: The results JSON; None = `default_output(model_dir)`.
        overwrite: Replace an existing results file.
        device: Where to run; None = `default_device()`.

    Returns:
        The results (`evaluate_lengths`) and the file they were written to.

    Raises:
        UserError: a bad request, or no requested length that could be evaluated.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"--model {model_dir}: no such model directory")
    out = Path(out) if out else default_output(model_dir)
    check_output_file(out)  # before evaluating
    source = data_source_of(data, model_dir)
    if out.exists() and not overwrite:  # earlier results (e.g. at other lengths) are not replaced unasked
        raise UserError(f"{out}: exists (pass --overwrite to replace it)")
    results = evaluate_lengths(model_dir, source, settings, device or default_device())
    if all("error" in r for r in results):  # nothing evaluated: not a result to write
        raise UserError(f"{model_dir}: no requested length could be evaluated ({results[0]['error']})")
    write_results(out, model_dir, results)
    return results, out


def data_source_of(data: str | None, model_dir: Path) -> str | Path:
    """What --data means: a path, else a shipped pretraining config's name; without it, the run of a final/ model.

    Raises:
        UserError: no --data for a model directory that is not a run's final/.
    """
    if not data:
        if model_dir.name != FINAL_DIR:
            raise UserError(
                "--data is required (a pretraining config or run directory) unless --model is a run's final/"
            )
        return model_dir.parent
    if not Path(data).exists():  # a shipped config's name; else the data source's own error
        with contextlib.suppress(ConfigError):
            return find_config(data, "pretrain")
    return data


def parse_lengths(text: str) -> list[int]:
    """`128,256` -> [128, 256].

    Raises:
        UserError: an item that is not an integer >= 1.
    """
    message = f"--seq-lens: expected comma-separated integers >= 1, got {text!r}"
    try:
        lengths = [int(item) for item in text.split(",")]
    except ValueError:
        raise UserError(message) from None
    if any(n < 1 for n in lengths):
        raise UserError(message)
    return lengths
