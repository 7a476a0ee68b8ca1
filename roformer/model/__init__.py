"""The encoder, plain PyTorch: nothing here knows about training, data or accelerate.

`config` (ModelConfig: the position encodings `rotary`, `sinusoidal`, `learned`, `shaw`, `t5_bias`, `alibi` and
`none`), `positions` (those encodings: rotary and its scaling, sinusoidal, the relative baselines), `layers` (norms,
embeddings, attention, the block), `model` (the models of every architecture, `backbone`, `masked_lm`,
`sequence_classification`, `token_classification`, `question_answering`, `multiple_choice` and `causal_lm`, and
`load`), `generation` (decoding a `causal_lm`), `weights` (model directories on disk: the file format, no model
import), `hf` (HF transformers interop), `pretrained` (a task's model from a roformer or HF directory), `onnx` (ONNX
export) and `flops`. Imports only `roformer.config`, `files` and `errors`.
"""
