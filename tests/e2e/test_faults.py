"""Runs that survive preemption, damaged checkpoints, full disks and diverging losses (the fast cases of
scripts/checks/chaos.py, in process: signals are sent to this process, write failures are injected OSErrors)."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from helpers import REPO, accelerate_launch, run_cli, tiny_run_config, train_losses
from safetensors.torch import load_file

from roformer.cli import main
from roformer.train import pretrain as pretrain_module
from roformer.train.checkpoints import CheckpointManager
from roformer.train.engine import Engine
from roformer.train.run_dir import read_metrics


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The config (dropout on) and an uninterrupted run of it: 8 steps, checkpoints every 2."""
    tmp = tmp_path_factory.mktemp("reference")
    yaml = tiny_run_config(
        tmp / "c.yaml", model={"hidden_dropout": 0.1}, max_steps=8, save_every=2, eval_every=4, keep_checkpoints=3
    )
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp / "run")]) == 0
    return yaml, tmp / "run"


def same_result(run: Path, reference: Path) -> None:
    """Equal logged losses, step for step, and equal final weights."""
    assert train_losses(run) == train_losses(reference)
    evals = [(e["step"], e["eval_loss"]) for e in read_metrics(run / "metrics.jsonl") if e["event"] == "eval"]
    assert evals == [(e["step"], e["eval_loss"]) for e in read_metrics(reference / "metrics.jsonl") if "eval_loss" in e]
    a, b = load_file(run / "final" / "model.safetensors"), load_file(reference / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def at_step(monkeypatch: pytest.MonkeyPatch, step: int, action) -> None:
    """Run `action()` right after optimizer step `step` (0-based) of the engine."""
    original = Engine.train_step

    def train_step(self, task, index):
        result = original(self, task, index)
        if index == step:
            action()
        return result

    monkeypatch.setattr(Engine, "train_step", train_step)


def fail_save(monkeypatch: pytest.MonkeyPatch, step: int, action) -> None:
    """Make accelerate's save_state of checkpoint `step` write a partial file, then call `action(directory)`."""
    import accelerate

    original = accelerate.Accelerator.save_state

    def save_state(self, directory, *args, **kwargs):
        if directory.endswith(f"step-{step}"):
            Path(directory, "model.safetensors").write_bytes(b"partial")
            action(directory)
        return original(self, directory, *args, **kwargs)

    monkeypatch.setattr(accelerate.Accelerator, "save_state", save_state)


def test_sigterm_finishes_the_step_checkpoints_and_resumes_exactly(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    yaml, ref = reference
    out = tmp_path / "run"
    at_step(monkeypatch, 4, lambda: os.kill(os.getpid(), signal.SIGTERM))  # between checkpoints 4 and 6
    code, err = run_cli(["--config", str(yaml), "--output-dir", str(out)], capsys)
    assert code == 75, err
    assert "stopped by SIGTERM after step 5" in err and len(err.strip().splitlines()) == 1
    assert CheckpointManager(out / "checkpoints").latest()[0] == 5  # no step lost
    assert read_metrics(out / "metrics.jsonl")[-1] == {"event": "stopped", "step": 5, "reason": "SIGTERM"}
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.undo()
    assert run_cli(["--output-dir", str(out), "--resume"], capsys)[0] == 0
    same_result(out, ref)


def test_a_second_signal_during_the_save_keeps_the_previous_checkpoint(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    yaml, ref = reference
    out = tmp_path / "run"
    at_step(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    fail_save(monkeypatch, 3, lambda directory: os.kill(os.getpid(), signal.SIGINT))  # the stop's own checkpoint
    code, err = run_cli(["--config", str(yaml), "--output-dir", str(out)], capsys)
    assert code == 130, err
    assert CheckpointManager(out / "checkpoints").latest_intact()[0] == 2
    monkeypatch.undo()
    assert run_cli(["--output-dir", str(out), "--resume"], capsys)[0] == 0
    same_result(out, ref)


def test_a_damaged_newest_checkpoint_falls_back_to_an_intact_one(
    reference: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml, ref = reference
    out = tmp_path / "run"
    assert (
        run_cli(
            [
                "--config",
                str(yaml),
                "--output-dir",
                str(out),
                "--set",
                "train.max_steps=6",
                "--set",
                "train.eval_every=2",
            ],
            capsys,
        )[0]
        == 0
    )
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2", "step-4", "step-6"]
    weights = checkpoints / "step-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    manager = CheckpointManager(checkpoints)
    assert manager.latest_intact()[0] == 4 and "bytes" in manager.verify(checkpoints / "step-6")
    same_size = checkpoints / "step-4" / "optimizer.bin"
    data = bytearray(same_size.read_bytes())
    data[100] ^= 0xFF  # overwritten in place: same size, other bytes
    same_size.write_bytes(bytes(data))
    assert "checksum" in manager.verify(checkpoints / "step-4") and manager.latest_intact()[0] == 2
    (checkpoints / "step-2" / "random_states_0.pkl").unlink()
    code, err = run_cli(["--output-dir", str(out), "--resume"], capsys)
    assert code == 2 and f"{checkpoints}: no intact checkpoint" in err and len(err.strip().splitlines()) == 1


def killed_after_checkpoint_6(yaml: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A run of `yaml` into `out` killed (KeyboardInterrupt) right after its step-6 checkpoint."""
    at_step(monkeypatch, 6, lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    assert run_cli(["--config", str(yaml), "--output-dir", str(out)], capsys)[0] == 130
    monkeypatch.undo()


def test_resume_from_an_older_intact_checkpoint_reproduces_the_run(
    reference: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    yaml, ref = reference
    out = tmp_path / "run"
    killed_after_checkpoint_6(yaml, out, monkeypatch, capsys)
    weights = out / "checkpoints" / "step-6" / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)
    assert run_cli(["--output-dir", str(out), "--resume"], capsys)[0] == 0
    assert "step-6 is damaged: model.safetensors does not match its checksum" in caplog.text
    same_result(out, ref)


def test_a_checkpoint_that_fails_to_load_despite_its_manifest_falls_back(
    reference: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A newest checkpoint without a manifest (written before manifests) whose weights are unreadable: the older."""
    yaml, ref = reference
    out = tmp_path / "run"
    killed_after_checkpoint_6(yaml, out, monkeypatch, capsys)
    newest = out / "checkpoints" / "step-6"
    (newest / "COMPLETE").write_text(json.dumps({"step": 6}))  # no file list: the manifest check passes
    (newest / "model.safetensors").write_bytes(b"\0" * 64)
    assert run_cli(["--output-dir", str(out), "--resume"], capsys)[0] == 0
    assert "step-6 is damaged: cannot be loaded" in caplog.text and "resuming from step-4 instead" in caplog.text
    same_result(out, ref)


def _disk_full(directory: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(directory, "optimizer.bin")))


def _disk_full_under_fsdp(directory: str) -> BaseException:
    """What torch.distributed.checkpoint (FSDP's sharded save) raises: a BaseException wrapping each rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("save failed", {0: (_disk_full(directory), None)})


@pytest.mark.parametrize("error", [_disk_full, _disk_full_under_fsdp])
def test_a_full_disk_while_saving_stops_cleanly_and_keeps_the_previous_checkpoint(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, error
) -> None:
    yaml, ref = reference
    out = tmp_path / "run"

    def disk_full(directory: str) -> None:
        raise error(directory)

    fail_save(monkeypatch, 4, disk_full)
    code, err = run_cli(["--config", str(yaml), "--output-dir", str(out)], capsys)
    assert code == 74, err
    assert "No space left on device" in err and "step-2 is intact" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]  # nothing half-written kept
    monkeypatch.undo()
    assert run_cli(["--output-dir", str(out), "--resume"], capsys)[0] == 0
    same_result(out, ref)


def poison(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """Make the loss of the given optimizer steps (0-based) NaN."""
    original_plan, original_loss = pretrain_module.Pretrainer.plan, pretrain_module._MaskedStep.loss

    def plan(self, step):
        result = original_plan(self, step)
        result.poisoned = step in steps
        return result

    def loss(self, model, batch):
        value, share = original_loss(self, model, batch)
        return (value * float("nan"), share * float("nan")) if getattr(self, "poisoned", False) else (value, share)

    monkeypatch.setattr(pretrain_module.Pretrainer, "plan", plan)
    monkeypatch.setattr(pretrain_module._MaskedStep, "loss", loss)


def test_a_non_finite_step_is_skipped_and_counted(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    yaml, _ = reference
    poison(monkeypatch, {2})
    out = tmp_path / "run"
    assert run_cli(["--config", str(yaml), "--output-dir", str(out), "--set", "train.log_every=1"], capsys)[0] == 0
    events = read_metrics(out / "metrics.jsonl")
    skipped = [e for e in events if e["event"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 3 and skipped[0]["loss"] != skipped[0]["loss"]  # NaN
    train = [e for e in events if e["event"] == "train"]
    assert all(e["loss"] == e["loss"] for e in train if e["step"] != 3)  # finite everywhere else
    assert train[-1]["skipped_steps"] == 1
    # the skipped update left weights and optimizer alone: AdamW counted 3 updates in 4 steps
    state = torch.load(out / "checkpoints" / "step-4" / "optimizer.bin", weights_only=False)
    assert {int(s["step"]) for s in state["state"].values()} == {3}  # 4 steps, 3 updates


def test_consecutive_non_finite_steps_stop_the_run_naming_the_last_good_checkpoint(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    yaml, _ = reference
    poison(monkeypatch, set(range(3, 8)))
    out = tmp_path / "run"
    code, err = run_cli(["--config", str(yaml), "--output-dir", str(out), "--set", "train.max_bad_steps=3"], capsys)
    assert code == 65, err
    assert "3 consecutive steps with a non-finite loss" in err and "checkpoint is " in err and "step-4" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [
        ["pretrain", "--config", "{yaml}", "--output-dir", "{bad}"],
        ["finetune", "--config", "{repo}/configs/glue/rte.yaml", "--set", "init={run}/final", "--output-dir", "{bad}"],
        ["glue", "--config", "{repo}/configs/glue/all.yaml", "--set", "init={run}/final", "--output-dir", "{bad}"],
        ["experiment", "--config", "{repo}/configs/experiments/rope-vs-bert-tiny.yaml", "--output-dir", "{bad}"],
        ["compare", "{run}", "--out", "{bad}"],
        ["eval-mlm", "--model", "{run}/final", "--out", "{bad}/lengths.json"],
        ["convert", "--to-hf", "{run}/final", "--out", "{bad}"],
    ],
)
def test_an_output_below_a_file_is_refused_before_any_work(
    command: list[str],
    reference: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    from roformer.data import store

    yaml, ref = reference
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setattr(store, "build_mlm_data", lambda *a, **k: pytest.fail("data was built"))
    args = [a.format(yaml=yaml, bad=blocker / "out", run=ref, repo=REPO) for a in command]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "is a file" in err and len(err.strip().splitlines()) == 1, err
    assert blocker.read_text() == "x"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_output_directory_is_refused(
    reference: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml, _ = reference
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, err = run_cli(["--config", str(yaml), "--output-dir", str(locked / "run")], capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2 and "is not writable" in err


def test_a_real_sigterm_to_a_running_process_exits_75_with_its_last_step_saved(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Across a process boundary, as a scheduler sends it (the in-process tests above patch the loop instead)."""
    import subprocess
    import sys
    import time

    yaml, _ = reference
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        "-m",
        "roformer",
        "pretrain",
        "--config",
        str(yaml),
        "--output-dir",
        str(out),
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.save_every=1000",
    ]
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(e.get("step", 0) >= 3 for e in _events(out)) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    trained = max(e["step"] for e in _events(out) if e["event"] == "train")
    assert CheckpointManager(out / "checkpoints").latest_intact()[0] == trained  # no step lost


def _events(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


@pytest.mark.slow
def test_chaos_script_small() -> None:
    """scripts/checks/chaos.py end to end with few faults (the full run is in the README)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = REPO / "scripts" / "checks" / "chaos.py"
    args = [sys.executable, str(script), "--kills", "3", "--terms", "2", "--steps", "24"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| SIGTERM | 2 | 2/2 | 0 | 0 |" in done.stdout


def test_two_processes_stop_after_the_same_step_when_one_gets_the_signal(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Rank 1 alone receives SIGTERM: both ranks finish the step, write one checkpoint together, exit 75."""
    yaml, _ = reference
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        "import os, signal, sys\n"
        "from roformer.train.engine import Engine\n"
        "original = Engine.train_step\n"
        "def train_step(self, task, step):\n"
        "    result = original(self, task, step)\n"
        "    if step == 2 and self.accelerator.process_index == 1:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return result\n"
        "Engine.train_step = train_step\n"
        "from roformer.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    out = tmp_path / "run"
    args = ["pretrain", "--config", str(yaml), "--output-dir", str(out), "--set", "train.batch_size=2"]
    done = accelerate_launch([str(wrapper), *args])
    assert done.returncode != 0 and "stopped by" in done.stderr, done.stderr[-3000:]
    assert CheckpointManager(out / "checkpoints").latest_intact()[0] == 3
    assert read_metrics(out / "metrics.jsonl")[-1]["event"] == "stopped"


def test_a_signal_before_training_stops_at_once_with_the_requeue_code(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """During data preparation there is no step to finish: stop now (a scheduler's grace period is short)."""
    yaml, _ = reference
    original = pretrain_module.build_data

    def build_data(config, tokenizer=None):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(config, tokenizer)

    monkeypatch.setattr(pretrain_module, "build_data", build_data)
    code, err = run_cli(["--config", str(yaml), "--output-dir", str(tmp_path / "run")], capsys)
    assert code == 75 and "outside training" in err and not (tmp_path / "run").exists()


def test_train_events_after_a_graceful_stop_equal_the_uninterrupted_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """log_every 3, SIGTERM after step 5: the step-6 event must average steps 4-6, as without the stop."""
    yaml = tiny_run_config(tmp_path / "c.yaml", model={"hidden_dropout": 0.1}, max_steps=9, log_every=3, save_every=4)
    assert run_cli(["--config", str(yaml), "--output-dir", str(tmp_path / "full")], capsys)[0] == 0
    at_step(monkeypatch, 4, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert run_cli(["--config", str(yaml), "--output-dir", str(tmp_path / "cut")], capsys)[0] == 75
    monkeypatch.undo()
    assert run_cli(["--output-dir", str(tmp_path / "cut"), "--resume"], capsys)[0] == 0
    timing = {"tokens_per_sec", "elapsed_sec", "data_fraction"}

    def train_events(run: Path) -> list[dict]:
        events = read_metrics(run / "metrics.jsonl")
        return [{k: v for k, v in e.items() if k not in timing} for e in events if e["event"] == "train"]

    assert [e["step"] for e in train_events(tmp_path / "full")] == [3, 6, 9]
    assert train_events(tmp_path / "cut") == train_events(tmp_path / "full")
