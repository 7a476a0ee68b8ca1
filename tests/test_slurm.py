"""scripts/slurm/pretrain.sbatch against a faked Slurm (srun, scontrol) and a faked launcher; and the real thing it
relies on: a 2-process CPU run stopped by SIGTERM through `accelerate launch` resumes exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_pretrain import accelerate_launch, tiny_run_config

from roformer.train.run_dir import read_metrics

SCRIPT = REPO / "scripts" / "slurm" / "pretrain.sbatch"

FAKE_SRUN = """#!/bin/bash
# srun: one task per node (SLURM_NODEID set), the options before the command skipped; signals reach the tasks
echo "srun $*" >> "$FAKE_LOG"
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do SLURM_NODEID=$node "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
code=0
for pid in "${pids[@]}"; do
    while true; do wait "$pid"; c=$?; kill -0 "$pid" 2>/dev/null || break; done
    (( c != 0 )) && code=$c
done
exit $code
"""

FAKE_SCONTROL = """#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
[[ "$1 $2" == "show hostnames" ]] && printf 'node-a\\nnode-b\\n'
exit 0
"""

FAKE_ROFORMER = """#!/bin/bash
echo "roformer $*" >> "$FAKE_LOG"
"""

FAKE_ACCELERATE = """#!/bin/bash
# the launcher: finishes, stops like a preempted run, fails, or runs until SIGTERM (then stops like the real one)
echo "accelerate $*" >> "$FAKE_LOG"
case "$FAKE_RUN" in
    finish) mkdir -p "$RUN/final" && touch "$RUN/final/model.safetensors"; exit 0 ;;
    preempt) exit 75 ;;
    error) exit 2 ;;
    wait)
        stopped='{"event": "stopped", "step": 7, "reason": "SIGTERM"}'
        trap 'echo "$stopped" >> "$RUN/metrics.jsonl"; exit 1' TERM
        mkdir -p "$RUN" && touch "$RUN/started-$SLURM_NODEID"
        while true; do sleep 0.1; done ;;
esac
"""


@pytest.fixture
def slurm(tmp_path: Path) -> dict[str, str]:
    """A PATH with fake srun, scontrol, roformer and accelerate, and the environment of a 2-node x 4-GPU job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("srun", FAKE_SRUN),
        ("scontrol", FAKE_SCONTROL),
        ("roformer", FAKE_ROFORMER),
        ("accelerate", FAKE_ACCELERATE),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "GPUS_PER_NODE": "4",
        "CONFIG": "configs/pretrain/roformer-base.yaml",
        "RUN": str(tmp_path / "run"),
    }


def sbatch(env: dict[str, str], fake_run: str) -> subprocess.CompletedProcess:
    env = {**env, "FAKE_RUN": fake_run}
    return subprocess.run(["bash", str(SCRIPT)], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)


def calls(env: dict[str, str]) -> list[str]:
    return Path(env["FAKE_LOG"]).read_text().splitlines()


def test_a_fresh_job_prepares_the_data_then_launches_one_launcher_per_node(slurm: dict[str, str]) -> None:
    done = sbatch(slurm, "finish")
    assert done.returncode == 0, done.stderr
    log = calls(slurm)
    assert "roformer prepare-data --config configs/pretrain/roformer-base.yaml" in log
    launches = sorted(line for line in log if line.startswith("accelerate "))
    assert len(launches) == 2  # one per node
    for rank, line in enumerate(launches):
        assert f"--num_machines 2 --num_processes 8 --machine_rank {rank}" in line, line
        assert "--main_process_ip node-a --main_process_port 29500" in line
        assert f"-m roformer pretrain --config configs/pretrain/roformer-base.yaml --output-dir {slurm['RUN']}" in line
        assert "--resume" not in line
    assert not any("requeue" in line for line in log)


def test_a_started_run_resumes_without_preparing_again(slurm: dict[str, str]) -> None:
    Path(slurm["RUN"]).mkdir()
    (Path(slurm["RUN"]) / "config.yaml").write_text("label: x\n")
    assert sbatch(slurm, "finish").returncode == 0
    launches = [line for line in calls(slurm) if line.startswith("accelerate ")]
    assert all(line.rstrip().endswith("--resume") for line in launches) and len(launches) == 2
    assert not any("prepare-data" in line for line in calls(slurm))


@pytest.mark.parametrize("outcome, code, requeued", [("preempt", 0, True), ("error", 2, False), ("finish", 0, False)])
def test_only_a_run_stopped_with_a_checkpoint_is_requeued(
    slurm: dict[str, str], outcome: str, code: int, requeued: bool
) -> None:
    done = sbatch(slurm, outcome)
    assert done.returncode == code, done.stderr
    assert ("scontrol requeue 4242" in calls(slurm)) is requeued


def test_the_time_limit_signal_is_forwarded_and_the_job_requeued(slurm: dict[str, str]) -> None:
    """--signal=B:USR1@600: the script tells the launchers to stop (SIGTERM); they checkpoint and exit 1."""
    env = {**slurm, "FAKE_RUN": "wait"}
    script = subprocess.Popen(["bash", str(SCRIPT)], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    run = Path(slurm["RUN"])
    deadline = time.monotonic() + 30
    while not all((run / f"started-{n}").exists() for n in (0, 1)):
        assert time.monotonic() < deadline and script.poll() is None, "the launchers did not start"
        time.sleep(0.05)
    script.send_signal(signal.SIGUSR1)
    out, _ = script.communicate(timeout=30)
    assert script.returncode == 0, out
    assert "scontrol requeue 4242" in calls(slurm) and "requeueing job 4242" in out


def test_a_finished_run_is_not_started_again(slurm: dict[str, str]) -> None:
    (Path(slurm["RUN"]) / "final").mkdir(parents=True)
    (Path(slurm["RUN"]) / "final" / "model.safetensors").write_bytes(b"")
    done = sbatch(slurm, "error")
    assert done.returncode == 0 and "is finished" in done.stdout
    assert not Path(slurm["FAKE_LOG"]).exists() or not any(line.startswith("accelerate") for line in calls(slurm))


def test_two_cpu_processes_stopped_by_sigterm_through_the_launcher_resume_exactly(tmp_path: Path) -> None:
    """What the script relies on: SIGTERM to `accelerate launch` reaches every worker, which checkpoints the same
    step; `--resume` through the launcher continues to the uninterrupted run's events and weights."""
    from safetensors.torch import load_file

    yaml = tiny_run_config(tmp_path / "c.yaml", model={"hidden_dropout": 0.1}, max_steps=40, log_every=3, save_every=0)
    program = ["-m", "roformer", "pretrain", "--config", str(yaml), "--set", "train.batch_size=2", "--output-dir"]
    assert accelerate_launch([*program, str(tmp_path / "full")]).returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    config = str(REPO / "configs" / "accelerate" / "multi-cpu.yaml")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, *program]
    launcher = subprocess.Popen([*command, str(tmp_path / "cut")], env=env, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "cut" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and launcher.poll() is None, "the run did not start"
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    launcher.communicate(timeout=120)
    stopped = read_metrics(metrics)[-1]
    assert stopped["event"] == "stopped" and stopped["step"] < 40, stopped
    assert accelerate_launch([*program, str(tmp_path / "cut"), "--resume"]).returncode == 0
    timing = {"tokens_per_sec", "elapsed_sec", "data_fraction"}

    def events(run: Path) -> list[dict]:
        kept = [e for e in read_metrics(run / "metrics.jsonl") if e["event"] in ("train", "eval")]
        return [{k: v for k, v in e.items() if k not in timing} for e in kept]

    assert events(tmp_path / "cut") == events(tmp_path / "full")
    a, b = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("cut", "full"))
    assert all(bool((a[k] == b[k]).all()) for k in a)
