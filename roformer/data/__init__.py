"""Data: the pretraining data: section, corpora, tokenizers, token stores and streams, MLM batches.

In the order data flows: config; builtin and text (documents), corpus (sources and the document split); tokenizer,
packing; cache, store (the memory-mapped token store) and streaming; masking, sampling and mlm (the batch of every
step); segment (exact character offsets of jieba-segmented text, for the tasks that point back into it). Fine-tuning
tasks are roformer.tasks. Imports no model and no training code.
"""
