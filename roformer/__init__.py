"""roformer: RoFormer (rotary position embedding) and a BERT baseline in one PyTorch encoder, with recipes.

Public API: `ModelConfig`, the models (`Backbone`, `MaskedLM`, `SequenceClassifier`), `load` (a saved model
directory), `Model.save`, and HF interop `from_hf` / `to_hf`.
"""

from roformer.checkpoint import load
from roformer.config import ModelConfig
from roformer.errors import CheckpointError, ConfigError, UserError
from roformer.hf import convert_rotary_layout, from_hf, to_hf
from roformer.model import Backbone, MaskedLM, Model, ModelOutput, SequenceClassifier

__version__ = "0.1.0"

__all__ = [
    "Backbone",
    "CheckpointError",
    "ConfigError",
    "MaskedLM",
    "Model",
    "ModelConfig",
    "ModelOutput",
    "SequenceClassifier",
    "UserError",
    "convert_rotary_layout",
    "from_hf",
    "load",
    "to_hf",
]
