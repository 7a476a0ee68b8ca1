"""The encoder, plain PyTorch: nothing here knows about training, data or accelerate.

Rooms, lowest first: `config` (ModelConfig, and the declarations of the position encodings, found in the modules that
declare `ENCODINGS`: the table in docs/baselines.md) and `search` (SearchConfig: how an encoder-decoder searches for
its targets), `weights` (model directories on disk: the file format, no model import), `flops` and `hf_files` (an HF
checkpoint on disk); `terms` (what attention reads of a position encoding),
`rotary` and `relative` (the paper's encoding and its relative baselines), then any other module that declares encodings
(those after the paper), `positions` (the absolute encodings and the modules by name); `dropout`, `layouts` (real
tokens, segments, query subsets, documents) and `masks` (the masks and the KV cache); `attention` (the forward's inputs
and context, the kernels' table, the layer) and `generation` (decoding a `causal_lm`); `layers` (norms, embeddings, the
block) and `plan` (the forward plan: layout and kernel, once per forward); `backbone` (the backbone and the base class)
and `heads` (the task heads); `model` (the models of every architecture, `backbone`, `masked_lm`,
`sequence_classification`, `token_classification`, `question_answering`, `multiple_choice` and `causal_lm`, and `load`),
with `seq2seq` below it (`encoder_decoder`: an encoder and a decoder with cross-attention) and `beam` beside
`generation` (its greedy and beam search); `hf` (HF transformers interop), `onnx` (ONNX export) and `pretrained` (a
task's model from a roformer or HF directory). Imports only `roformer.config`, `files` and `errors`.
"""
