"""Training: the one engine and the two recipes it runs.

config (the train: sections and whole run configs), engine (the loop, evaluation points, checkpoint save and
resume, on any number of processes), launch (accelerate set-up), optim, checkpoints, sharded (FSDP2 state through
torch.distributed.checkpoint), interval, faults, evaluate, run_dir (the run-directory lifecycle and every file name),
and the recipes: pretrain, finetune. Imports data, model and tasks, never study (nor roformer.embed).
"""
