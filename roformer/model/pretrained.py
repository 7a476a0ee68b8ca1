"""Starting a model for a task from pretrained weights: a roformer model directory or an HF checkpoint.

Written once for every recipe: fine-tuning builds a sequence classifier with `num_labels` outputs from its `init`,
continued pretraining starts a masked LM from one. Whatever the source holds (a backbone, a masked LM, a classifier)
its backbone is kept; a head the source lacks is drawn from the torch RNG, so seed it first for repeatable heads.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from roformer.errors import CheckpointError, ConfigError, UserError
from roformer.model.config import EncoderDecoderConfig, ModelConfig
from roformer.model.hf import from_hf, hf_model_config
from roformer.model.model import EncoderDecoder, Model, convert_rotary_layout, load
from roformer.model.weights import MODEL_CONFIG_FILE, WEIGHTS_FILE, read_model_config


def is_roformer_dir(source: str | Path) -> bool:
    """A directory written by `Model.save` (it has model.yaml)."""
    return (Path(source) / MODEL_CONFIG_FILE).is_file()


def pretrained_config(
    source: str | Path, architecture: str, num_labels: int | None = None, **overrides: Any
) -> ModelConfig | EncoderDecoderConfig:
    """The config `load_pretrained` would give, read without loading the weights (to check a job before it trains).

    Raises:
        UserError: no model at `source`, or an override that is not a ModelConfig field or does not fit.
    """
    path = _check_source(source)
    if is_roformer_dir(path):
        if not (path / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"{path / WEIGHTS_FILE}: weights file not found")
        saved, config = read_model_config(path)
        _check_pair(saved, architecture, path)  # before the overrides: an encoder-decoder's keys are not ModelConfig's
    else:
        config = hf_model_config(str(source), architecture)
    labels = {} if num_labels is None else {"num_labels": num_labels}
    return _with(config, {**labels, **overrides})


def load_pretrained(source: str | Path, architecture: str, num_labels: int | None = None, **overrides: Any) -> Model:
    """A model of `architecture` whose backbone (and head, where the source has this one) comes from `source`.

    Args:
        source: A roformer model directory, an HF `save_pretrained` directory, or an HF hub name.
        architecture: `backbone`, `masked_lm`, `sequence_classification`, `token_classification`,
            `question_answering`, `multiple_choice` or `causal_lm`; or `encoder_decoder` from an encoder-decoder
            (ours, or HF's EncoderDecoderModel) only.
        num_labels: Outputs of a classifier; a classifier (ours or HF) saved with another count gets a fresh output
            layer, logged in one line.
        **overrides: ModelConfig fields to change (dropout, ...); they must keep the parameter shapes.

    Returns:
        The model, in train mode.

    Raises:
        UserError: no model at `source`, an unknown override, weights that do not fit.
    """
    path = _check_source(source)
    labels = {} if num_labels is None else {"num_labels": num_labels}
    # a classifier saved for another task gets a fresh output layer (its shape no longer fits), either way
    if is_roformer_dir(path):
        return load(path, architecture=architecture, **labels, **overrides).train()
    _check_fields(overrides)
    return from_hf(str(source), architecture=architecture, **labels, **overrides).train()


def load_weights_from(model: Model, source: str | Path) -> None:
    """Copy the weights of the model of the same architecture in `source` into `model` (built from another config).

    The configs may differ in what holds no parameters (dropout, rope_scaling, the rotary layout: the q/k rows are
    permuted), not in shapes.

    Raises:
        UserError: no model at `source`, or its shapes differ from `model`'s.
    """
    pretrained = load_pretrained(source, model.architecture)
    if isinstance(model, EncoderDecoder):  # its halves' layout (one for both, as load(rotary_layout=...) gives)
        if pretrained.config.encoder.encoding.rotates or pretrained.config.decoder.encoding.rotates:
            pretrained = convert_rotary_layout(pretrained, model.config.encoder.rotary_layout)
    elif model.config.encoding.rotates and model.config.position_encoding == pretrained.config.position_encoding:
        # the saved q/k rows follow the saved layout: permuted into the model's, as load(rotary_layout=...) does
        pretrained = convert_rotary_layout(pretrained, model.config.rotary_layout)
    try:
        model.load_state_dict(pretrained.state_dict())
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line or "key" in line), "")
        raise UserError(f"init: {source} does not fit the model section ({first.rstrip('.')})") from None


def check_init(init: str | Path, key: str = "init") -> None:
    """Refuse an init that names no folder, in those words, before its tokenizer or its weights are looked for.

    Raises:
        UserError: `init` is not a directory (missing, or a file).
    """
    path = Path(init)
    if path.is_dir():
        return
    what = "a file, not a model folder" if path.exists() else "no such model folder"
    raise UserError(
        f"{key}: {path}: {what} (a run's final/ of roformer pretrain, or a roformer or HF save_pretrained folder; "
        "a hub model: roformer convert --from-hf NAME --out DIR)"
    )


def _check_source(source: str | Path) -> Path:
    """`source` as a path; a directory must hold a roformer or HF model (anything else may be a hub name)."""
    path = Path(source)
    if path.exists() and not is_roformer_dir(path) and not (path / "config.json").is_file():
        raise UserError(f"{path}: no model here (neither {MODEL_CONFIG_FILE} nor an HF config.json)")
    return path


def _check_pair(saved: str, architecture: str, path: Path) -> None:
    """Refuse a single model where an encoder-decoder is wanted, in those words.

    Raises:
        CheckpointError: `architecture` is encoder_decoder and the directory holds another model.
    """
    if architecture == "encoder_decoder" != saved:
        raise CheckpointError(f"{path}: not an encoder-decoder (a {saved} model); encoder_decoder needs one")


def _check_fields(overrides: dict[str, Any]) -> None:
    """Refuse a name in the `model:` section of a fine-tuning config that is not a ModelConfig field."""
    unknown = [k for k in overrides if k not in {f.name for f in fields(ModelConfig)}]
    if unknown:
        raise ConfigError(f"model: unknown ModelConfig field '{unknown[0]}'")


def _with(config: ModelConfig | EncoderDecoderConfig, overrides: dict[str, Any]) -> ModelConfig | EncoderDecoderConfig:
    """`config` with ModelConfig `overrides` (the `model:` section of a fine-tuning config; both halves of a pair)."""
    _check_fields(overrides)
    if isinstance(config, EncoderDecoderConfig):
        return config.replaced(**overrides)
    return replace(config, **overrides)
