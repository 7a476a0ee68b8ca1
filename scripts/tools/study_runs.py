"""The runs of a task study as separate commands, to train side by side (one GPU, or several machines).

`roformer experiment` trains a task study's (task, arm, seed) runs one after another. On a GPU that a small model
leaves mostly idle they can run at once: this writes every unfinished run's resolved config (the arm's overrides,
the study's and the seed, exactly as the experiment resolves them) to `<out>/<task>/<arm>-seed<k>.yaml` and prints
one line per run, `CONFIG RUN_DIR` (with `--print0`, each ended by a NUL), for the caller to start (xargs -P, a job
array). Once the runs are done, `roformer experiment --config STUDY --output-dir OUT --compare-only` (with the same
--set) tabulates them as if the experiment had trained them.

    python scripts/tools/study_runs.py configs/experiments/mqar-zoology.yaml runs/mqar-zoology \\
        --set train.progress=false \\
        --print0 | xargs -0 -n 2 -P 8 sh -c 'roformer finetune --config "$0" --output-dir "$1" > "$1.log" 2>&1'
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from roformer.catalogue import find_config
from roformer.config_yaml import write_yaml
from roformer.study.experiment_config import TaskStudyConfig, load_experiment_config
from roformer.study.task_study import load_task_arms, run_path
from roformer.train.run_dir import RESULTS_FILE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a task study (an experiment config with tasks:), a path or a shipped name")
    parser.add_argument("out", type=Path, help="the study's output folder (as `roformer experiment --output-dir`)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of every run")
    parser.add_argument("--print0", action="store_true", help="CONFIG and RUN_DIR each ended by a NUL (xargs -0 -n 2)")
    args = parser.parse_args()
    path = find_config(args.config, "experiments")
    experiment = load_experiment_config(path)
    if not isinstance(experiment, TaskStudyConfig):
        parser.error(f"{path}: not a task study (no tasks:): its arms are pretraining configs")
    for seed in experiment.seeds:  # seeds first, as the experiment trains them
        for task, arms in load_task_arms(experiment, path, args.set).items():
            for label, arm in arms.items():
                directory = run_path(args.out, task, label, seed)
                if not experiment.arm_runs_seed(label, seed) or (directory / RESULTS_FILE).is_file():
                    continue
                config = replace(arm, train=replace(arm.train, seed=seed, seeds=[]))
                file = directory.parent / f"{directory.name}.yaml"  # a label may hold dots
                file.parent.mkdir(parents=True, exist_ok=True)
                write_yaml(file, config.to_dict())
                sys.stdout.write(f"{file}\0{directory}\0" if args.print0 else f"{file} {directory}\n")


if __name__ == "__main__":
    main()
