"""The test suite's layout and its shared fixtures.

tests/unit/  fast: model maths (rotary, relative encodings, masks, precision), configs, data units (tokenizer,
             packing, token store format, GLUE files), statistics, metrics, FLOPs, markdown, the package's layout,
             HF and JunnYu parity on tiny random models. Seconds in all: `python -m pytest -q tests/unit`.
tests/e2e/   whole commands and runs: tiny pretraining and fine-tuning runs, resume, several processes, faults and
             full disks, Slurm, experiments, hub pushes, `convert` in a subprocess, ONNX export, torch.compile, the
             docs, notebooks, the wheel, CI, the GPU.
tests/golden/  reference files (JunnYu's port, scripts/references/junnyu_goldens.py).

`python -m pytest -q` runs both (pyproject.toml: testpaths, and `-m 'not slow'`: `-m slow` runs the long ones; `gpu`
tests skip without CUDA). A new test goes to unit/ if it takes well under a second and starts no training run and
no launch, else to e2e/; a file that would hold both is split.

What test modules share is in tests/helpers.py (`from helpers import tiny_config, tiny_run_config, ...`): this file,
at tests/, puts tests/ on sys.path (pytest's default `prepend` import mode), so both folders import it. Test files
never import each other, and their names are unique across the folders (the same mode requires it). The fixtures of
both folders are here, so that a session fixture (a pretrained tiny model) is built once for the whole run.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; fail fast instead of hanging
import tempfile

# The packed-data cache of the tests lives in a fresh directory, never in the user's ~/.cache/roformer.
os.environ["ROFORMER_CACHE"] = tempfile.mkdtemp(prefix="roformer-test-cache-")
import csv
import random
from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA, tiny_run_config


def share_the_cores_between_workers() -> None:
    """Under pytest-xdist (`-n auto`), each worker's torch gets cores / workers threads, and so does every process it
    starts that does not set its own.

    Torch's default is one thread per core in every worker: two workers on two cores ran four threads that spun
    against each other, and tests/e2e/test_finetune.py took 82 s instead of 39 s. A thread count the user set wins.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the runs and launches the tests start
        torch.set_num_threads(threads)  # imported already: the variable is read at import


share_the_cores_between_workers()


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip: a fresh clone does not have it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            f"real data not found at {SHARED_DATA} (set ROFORMER_DATA or ROFORMER_SHARED_DATA, or place ../shared "
            "beside the repo)"
        )
    return SHARED_DATA


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny RoFormer pretrained for a few steps on the built-in corpus (its final/ has model + tokenizer)."""
    from roformer.config import load
    from roformer.train.config import PretrainConfig
    from roformer.train.pretrain import pretrain

    tmp = tmp_path_factory.mktemp("pretrained")
    yaml = tiny_run_config(tmp / "c.yaml", max_steps=20, lr=2e-3, eval_every=0, save_every=0, log_every=10)
    return pretrain(load(PretrainConfig, yaml), tmp / "run") / "final"


@pytest.fixture(scope="session")
def number_task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A balanced binary task on built-in sentences: does the sentence contain a number word (majority = 50%)?"""
    from roformer.data.builtin import NUMBERS, generate_documents

    tmp = tmp_path_factory.mktemp("numbers")
    sentences = [s.strip() for d in generate_documents(1500, seed=9) for s in d.split(" . ") if s.strip()]
    numbers = set(NUMBERS)
    positive = [s for s in sentences if numbers & set(s.split())]
    negative = [s for s in sentences if not numbers & set(s.split())]
    rng = random.Random(0)
    rows = [(s, 1) for s in rng.sample(positive, 300)] + [(s, 0) for s in rng.sample(negative, 300)]
    rng.shuffle(rows)
    files = {"train": rows[:440], "dev": rows[440:541], "test": rows[541:598]}  # odd sizes on purpose
    paths = {}
    for split, split_rows in files.items():
        path = tmp / f"{split}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"] if split != "test" else ["idx", "sentence"])
            for i, (sentence, label) in enumerate(split_rows):
                writer.writerow([sentence, label] if split != "test" else [i, sentence])
        paths[split] = path
    return paths
