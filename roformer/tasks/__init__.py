"""Fine-tuning tasks: every kind of downstream work `roformer finetune` trains, each a module with its declaration.

A type's module ends in `SPECS = (TaskSpec(...),)`; registry collects them (roformer.plugins.declarations: the types
are listed nowhere else), so a new type is a new module. The shared rooms under the types (the task protocol in base,
the trivial baselines, the registry, the readers, the metrics, the data: section in config) and their order are in
docs/architecture.md, which tests/unit/test_layout.py checks against the imports; the types themselves are the
table of docs/fine-tuning.md, generated from their declarations. Imports the data floor (tokenizers, jieba
segmentation) and no training code.
"""
