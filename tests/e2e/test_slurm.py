"""scripts/slurm/pretrain.sbatch against a faked Slurm (srun, scontrol) and a faked launcher (an elastic requeue onto
fewer nodes keeping the global batch among the cases); and the real things it relies on: a 2-process CPU run stopped
by SIGTERM through `accelerate launch` resumes exactly, and a node that fails at start-up ends the other's launch (two
`accelerate launch --num_machines 2` on this machine) within minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, accelerate_launch, free_port, tiny_run_config

from roformer.train.run_dir import read_metrics

SCRIPT = REPO / "scripts" / "slurm" / "pretrain.sbatch"

FAKE_SRUN = """#!/bin/bash
# srun: one task per node (SLURM_NODEID set), each in its own process group; the options before the command are
# skipped but --kill-on-bad-exit. As in Slurm, a signal reaches every process of the tasks (not only the first), and
# with --kill-on-bad-exit=1 a task that exits non-zero gets the others SIGTERM (Slurm's SIGKILL KillWait seconds later
# is left out: the fake tasks all end on SIGTERM). The exit code is the tasks' highest.
echo "srun ${*//$'\\n'/ }" >> "$FAKE_LOG"  # one line (the launch's task is a script)
echo $$ > "$FAKE_LOG.srun-pid"
kill_on_bad_exit=0
while [[ "$1" == --* ]]; do
    [[ "$1" == --kill-on-bad-exit=* ]] && kill_on_bad_exit=${1#*=}
    shift
done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do SLURM_NODEID=$node setsid "$@" & pids+=($!); done
signal_tasks() { for pid in "${pids[@]}"; do kill -"$1" -- "-$pid" 2>/dev/null; done; }
trap 'signal_tasks TERM' TERM
code=0
running=("${pids[@]}")
while (( ${#running[@]} > 0 )); do
    finished=""
    wait -n -p finished "${running[@]}"
    c=$?
    [[ -z "$finished" ]] && continue  # a trapped signal interrupted the wait
    left=()
    for pid in "${running[@]}"; do [[ $pid != "$finished" ]] && left+=("$pid"); done
    running=("${left[@]}")
    (( c > code )) && code=$c
    (( c != 0 && kill_on_bad_exit == 1 )) && signal_tasks TERM
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
# the launcher: once every node's has started (as the real ones meet first), finishes, stops like a preempted run,
# fails, or runs until SIGTERM and then stops like the real one (node 0, the main process's, last: it writes the
# checkpoint and the stop record; a second SIGTERM meanwhile, which would abort the real save, is recorded);
# fail-node-1: node 1 fails at start-up while node 0 waits for it
echo "accelerate $*" >> "$FAKE_LOG"
stopped='{"event": "stopped", "step": 7, "reason": "SIGTERM"}'
stopping=0
trap '(( stopping )) && touch "$RUN/interrupted-$SLURM_NODEID"; stopping=1' TERM
mkdir -p "$RUN" && touch "$RUN/started-$SLURM_NODEID"
# at most 30 s: a launcher left behind by a test must not live on after it
for ((i = 0; i < 600; i++)); do (( $(ls "$RUN" | grep -c '^started-') >= SLURM_NNODES )) && break; sleep 0.05; done
case "$FAKE_RUN" in
    finish) mkdir -p "$RUN/final" && touch "$RUN/final/model.safetensors"; exit 0 ;;
    preempt) exit 75 ;;
    error) exit 2 ;;
    wait)
        until (( stopping )); do sleep 0.1; done
        if [[ $SLURM_NODEID == 0 ]]; then
            sleep 1
            echo "$stopped" >> "$RUN/metrics.jsonl"
        fi
        exit 1 ;;
    fail-node-1)
        [[ $SLURM_NODEID == 1 ]] && exit 2
        for ((i = 0; i < 200 && !stopping; i++)); do sleep 0.1; done  # waits 20 s for node 1, then gives up
        (( stopping )) && touch "$RUN/ended-0"
        exit 3 ;;
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


def start_sbatch(env: dict[str, str], fake_run: str) -> subprocess.Popen:
    """The script started with launchers that run until told to stop; returns once both nodes' launchers run."""
    script = subprocess.Popen(
        ["bash", str(SCRIPT)], env={**env, "FAKE_RUN": fake_run}, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    run = Path(env["RUN"])
    deadline = time.monotonic() + 30
    while not all((run / f"started-{n}").exists() for n in (0, 1)):
        assert time.monotonic() < deadline and script.poll() is None, "the launchers did not start"
        time.sleep(0.05)
    return script


def test_the_time_limit_signal_is_forwarded_and_the_job_requeued(slurm: dict[str, str]) -> None:
    """--signal=B:USR1@600: the script tells the launchers to stop (SIGTERM); they checkpoint and exit 1. Node 0
    finishes last (it writes the checkpoint): node 1's exit before it must not end it (--kill-on-bad-exit)."""
    script = start_sbatch(slurm, "wait")
    script.send_signal(signal.SIGUSR1)
    out, _ = script.communicate(timeout=30)
    assert script.returncode == 0, out
    assert "scontrol requeue 4242" in calls(slurm) and "requeueing job 4242" in out
    run = Path(slurm["RUN"])
    assert not list(run.glob("interrupted-*"))  # no second SIGTERM while node 0 wrote its checkpoint
    assert read_metrics(run / "metrics.jsonl")[-1]["event"] == "stopped"


def test_a_stop_signal_to_the_steps_alone_requeues_from_the_run_record(slurm: dict[str, str]) -> None:
    """`scancel --signal=TERM JOB` signals the steps, not this script: every node stops and exits 0, and the run's
    metrics.jsonl, which now ends with the stop, says that it stopped with a checkpoint."""
    script = start_sbatch(slurm, "wait")
    srun = int(Path(slurm["FAKE_LOG"] + ".srun-pid").read_text())
    os.kill(srun, signal.SIGTERM)
    out, _ = script.communicate(timeout=30)
    assert script.returncode == 0, out
    assert "scontrol requeue 4242" in calls(slurm)


def test_a_node_that_fails_ends_the_other_nodes(slurm: dict[str, str]) -> None:
    """Node 1 fails at start-up (exit 2) while node 0 waits for it: srun --kill-on-bad-exit=1 ends node 0 at once
    (it would hold its GPUs until the rendezvous timeout, or until the job's time limit), and the job fails with
    node 1's code, not requeued."""
    start = time.monotonic()
    done = sbatch(slurm, "fail-node-1")
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr
    assert (Path(slurm["RUN"]) / "ended-0").exists() and elapsed < 15, elapsed  # node 0 waits 20 s on its own
    assert not any("requeue" in line for line in calls(slurm))
    assert all("--kill-on-bad-exit=1" in line for line in calls(slurm) if line.startswith("srun "))


def test_a_failure_after_an_earlier_stop_is_not_requeued(slurm: dict[str, str]) -> None:
    """A requeued job's metrics.jsonl ends with its earlier start's stop: a failure now must not be read as a stop,
    or the job would requeue and fail again, forever."""
    run = Path(slurm["RUN"])
    run.mkdir()
    (run / "config.yaml").write_text("label: x\n")
    (run / "metrics.jsonl").write_text('{"event": "stopped", "step": 7, "reason": "SIGTERM"}\n')
    done = sbatch(slurm, "error")
    assert done.returncode == 2, done.stdout
    assert not any("requeue" in line for line in calls(slurm))


def test_an_elastic_job_requeued_onto_fewer_nodes_keeps_the_global_batch(slurm: dict[str, str]) -> None:
    """`sbatch --nodes 2-4` with GLOBAL_BATCH and MICRO_BATCH: started on 2 nodes x 4 GPUs, stopped and requeued,
    restarted on 1 node: every start sets batch_size and the grad_accum that keeps the global batch (64 = 4 x 8 x 2 =
    4 x 4 x 4); the run itself resumes exactly under it (tests/e2e/test_elastic.py)."""
    elastic = {**slurm, "GLOBAL_BATCH": "64", "MICRO_BATCH": "4"}
    script = start_sbatch(elastic, "wait")
    script.send_signal(signal.SIGUSR1)
    out, _ = script.communicate(timeout=30)
    assert script.returncode == 0 and "scontrol requeue 4242" in calls(slurm), out
    assert "2 nodes x 4 GPUs x batch_size 4 x grad_accum 2: global batch 64" in out
    run = Path(slurm["RUN"])
    (run / "config.yaml").write_text("label: x\n")  # what the first start's run wrote
    for started in run.glob("started-*"):  # the fake launchers' marks of the first start
        started.unlink()
    done = sbatch({**elastic, "SLURM_NNODES": "1"}, "finish")  # the requeued job got one node
    assert done.returncode == 0, done.stderr
    launches = [line for line in calls(slurm) if line.startswith("accelerate ")]
    assert len(launches) == 3  # two nodes, then one
    for line in launches[:2]:
        assert "--num_machines 2 --num_processes 8" in line and "--set train.grad_accum=2" in line, line
    assert "--num_machines 1 --num_processes 4 --machine_rank 0" in launches[2]
    assert launches[2].rstrip().endswith("--resume --set train.batch_size=4 --set train.grad_accum=4"), launches[2]


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"GLOBAL_BATCH": "64", "MICRO_BATCH": "4", "SLURM_NNODES": "3"}, "not a multiple of MICRO_BATCH x processes"),
        ({"GLOBAL_BATCH": "64"}, "GLOBAL_BATCH and MICRO_BATCH go together"),
        ({"GLOBAL_BATCH": "64", "MICRO_BATCH": "four"}, "GLOBAL_BATCH and MICRO_BATCH go together"),
    ],
)
def test_an_elastic_start_whose_node_count_does_not_divide_the_global_batch_is_refused(
    slurm: dict[str, str], settings: dict[str, str], says: str
) -> None:
    """3 nodes x 4 GPUs x 4 examples do not divide 64: exit 2 before any launch, not requeued (a requeue would meet
    the same count again)."""
    done = sbatch({**slurm, **settings}, "finish")
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not Path(slurm["FAKE_LOG"]).exists() or not any(
        line.startswith(("accelerate", "srun", "scontrol requeue")) for line in calls(slurm)
    )


def test_a_finished_run_is_not_started_again(slurm: dict[str, str]) -> None:
    (Path(slurm["RUN"]) / "final").mkdir(parents=True)
    (Path(slurm["RUN"]) / "final" / "model.safetensors").write_bytes(b"")
    done = sbatch(slurm, "error")
    assert done.returncode == 0 and "is finished" in done.stdout
    assert not Path(slurm["FAKE_LOG"]).exists() or not any(line.startswith("accelerate") for line in calls(slurm))


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
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


def test_a_node_that_fails_before_the_group_forms_ends_the_other_within_the_rendezvous_timeout(tmp_path: Path) -> None:
    """The script's launch for real on this machine: one `accelerate launch --num_machines 2` per "node", one CPU
    process each. Node 1 fails at start-up (its config is missing there); node 0's process, waiting for it at node
    0's launcher store, gives up after ROFORMER_RENDEZVOUS_TIMEOUT (5 s here), not the 4-hour collective timeout,
    in one line; each launcher then exits 1 (accelerate's code for a failed worker) under its own report."""
    config = tiny_run_config(tmp_path / "c.yaml", max_steps=2, data={"cache_dir": str(tmp_path / "cache")})
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "ROFORMER_RENDEZVOUS_TIMEOUT": "5"}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "configs" / "accelerate" / "multi-cpu.yaml"), "--num_machines", "2", "--num_processes", "2",
                "--main_process_ip", "127.0.0.1", "--main_process_port", port]  # fmt: skip
    start = time.monotonic()
    nodes = []
    for rank, yaml in ((0, config), (1, tmp_path / "missing-on-node-1.yaml")):
        program = ["-m", "roformer", "pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / f"run-{rank}")]
        command = [*launcher, "--machine_rank", str(rank), *program]
        nodes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errors = [node.communicate(timeout=90)[1] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.kill()
        pytest.fail(f"node 0 was still waiting for node 1 after {time.monotonic() - start:.0f} s")
    elapsed = time.monotonic() - start
    assert [node.returncode for node in nodes] == [1, 1], errors
    assert "missing-on-node-1.yaml: config file not found" in errors[1]
    ours = [line for line in errors[0].splitlines() if line.startswith("roformer pretrain: ")]
    assert len(ours) == 1, errors[0]
    assert ours[0].startswith(
        f"roformer pretrain: error: the process group did not form: rank 0 of 2 waited 5 s at 127.0.0.1:{port} for "
        "rank 1, which never joined"
    ), ours
    assert f'File "{REPO / "roformer"}' not in errors[0]  # no traceback of ours (the launcher's report follows)
    assert elapsed < 60, elapsed
