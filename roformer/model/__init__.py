"""The encoder, plain PyTorch: nothing here knows about training, data or accelerate.

`config` (ModelConfig), `model` (the modules, one file top to bottom, and `load`), `weights` (model directories on
disk: the file format, no model import), `hf` (HF transformers interop), `pretrained` (a task's model from a
roformer or HF directory) and `flops`. Imports only `roformer.config`, `files` and `errors`.
"""
