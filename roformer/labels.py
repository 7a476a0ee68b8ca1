"""The label of a position no loss scores, one value for every floor that makes or reads labels.

MLM batches (roformer.data.masking), the model's losses (roformer.model.heads) and the tasks' token labels
(roformer.tasks.tagging) meet here: -100 is the default `ignore_index` of torch's cross-entropy, as in HF
transformers, so labels made here are read there without translation.
"""

IGNORE_INDEX = -100
