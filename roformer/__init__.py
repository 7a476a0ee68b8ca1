"""roformer: RoFormer (rotary position embedding) and a BERT baseline in one PyTorch encoder, with recipes.

Public API: `ModelConfig`, the models (`Backbone`, `MaskedLM`, `SequenceClassifier`, `TokenClassifier`,
`QuestionAnswering`, `MultipleChoice`, `CausalLM`), the encoder-decoder (`EncoderDecoder` of an
`EncoderDecoderConfig`: translation, greedy and beam search), `load` (a saved model directory), `Model.save`, HF
interop `from_hf` / `to_hf`, and `SentenceEncoder` (texts to sentence vectors with a model directory and its
tokenizer).

Package layout (data flows one way: cli -> study -> train -> data / model -> config / files / errors):

    config, files, errors   the one config loader, atomic files and staged directories, user-facing errors
    model/                  ModelConfig, the encoder (one file), model directories on disk, HF interop
    data/                   corpora, tokenizers, packing, MLM masking and batches, GLUE tasks and metrics
    train/                  the one training engine, run directories, the pretraining and fine-tuning recipes
    study/                  experiments, GLUE suites, length evaluation and comparisons of finished runs
    cli                     the `roformer` command

The names below are imported on first use, so `import roformer.study.compare` (reporting) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from roformer.version import __version__

_PUBLIC = {
    "Backbone": "roformer.model.model",
    "MaskedLM": "roformer.model.model",
    "Model": "roformer.model.model",
    "ModelOutput": "roformer.model.model",
    "SequenceClassifier": "roformer.model.model",
    "TokenClassifier": "roformer.model.model",
    "QuestionAnswering": "roformer.model.model",
    "MultipleChoice": "roformer.model.model",
    "CausalLM": "roformer.model.model",
    "EncoderDecoder": "roformer.model.model",
    "Seq2SeqOutput": "roformer.model.model",
    "EncoderDecoderConfig": "roformer.model.config",
    "load": "roformer.model.model",
    "ModelConfig": "roformer.model.config",
    "convert_rotary_layout": "roformer.model.model",
    "from_hf": "roformer.model.hf",
    "to_hf": "roformer.model.hf",
    "SentenceEncoder": "roformer.embed",
    "CheckpointError": "roformer.errors",
    "ConfigError": "roformer.errors",
    "UserError": "roformer.errors",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Import a public name (or a subpackage such as `roformer.config`) when it is first used."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"roformer.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"roformer.{name}":
            raise
        raise AttributeError(f"module 'roformer' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
