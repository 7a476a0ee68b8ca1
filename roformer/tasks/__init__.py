"""Fine-tuning tasks: every kind of downstream work `roformer finetune` trains, each a module with its declaration.

A type's module ends in `SPECS = (TaskSpec(...),)`; registry collects them (the types are listed nowhere else), so a
new type is a new module. In the order imports flow: base (the task protocol `FinetuneTask`, `TaskSpec`, the members
every type shares, encoded rows, padding), registry (the declared types, `make_task`), records (rows of csv, tsv,
JSON, parquet and hub files), objectives (the losses a type trains with beside a head's own), the metrics
(glue_metrics, tagging_metrics, qa_metrics, ir_metrics) and GLUE's metadata (glue_tasks); config
(`FinetuneDataConfig`, the data: section, holding the types' settings sections and folders) and beir (a retrieval
set's folder); texts (the text types' shared reader and label kinds), conll (tagged sentences: CoNLL, JSON lines,
hub) and squad (SQuAD-format questions); the task types: glue (GlueTask), classify (classification, regression,
multi-label classification), tagging (token classification), qa (extractive question answering), choices (multiple
choice), similarity (a bi-encoder of text pairs), triplet (which of two candidates is closer: CAIL2019-SCM),
retrieval (a bi-encoder ranking a corpus), rerank (a cross-encoder reordering a first stage). Imports the data floor
(tokenizers, jieba segmentation) and no model and no training code.
"""
