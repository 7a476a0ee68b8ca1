"""Data: the data: sections, corpora, tokenizers, token stores and streams, MLM batches, GLUE tasks and metrics.

In the order data flows: config; builtin and text (documents), corpus (sources and the document split); tokenizer,
packing; cache, store (the memory-mapped token store) and streaming; masking, sampling and mlm (the batch of every
step). Fine-tuning: tasks (the task protocol and make_task); GLUE, its first task: glue_tasks (metadata and readers),
glue (encoding, padding, GlueTask), glue_metrics. Imports no model and no training code.
"""
