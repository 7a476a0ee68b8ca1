"""A full disk outside the training loop: every command's writes end in one line naming the path and exit 74.

docs/cli.md promises it for every write: the final model of a pretraining run (one and two processes), the token
store (`prepare-data`, and `pretrain` when it builds one), `convert` both ways, `export`, `eval-mlm`, `compare`,
`finetune`. Nothing already written is lost: an existing output stays as it was. Two ways to fill the disk:
a real tmpfs of a few KB where this machine lets us mount one (CI's does; elsewhere those tests skip, saying so),
and a write made to fail with ENOSPC everywhere.
"""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import finished_run, last_line, launch_two, make_hf, task_config, tiny_run_config, write_wrapper
from safetensors.torch import save_file

from roformer.cli import main
from roformer.files import is_write_failure

FULL = os.strerror(errno.ENOSPC)


def one_line(err: str) -> str:
    """The command's one line on stderr (progress bars aside), with no traceback."""
    lines = [line for line in err.strip().splitlines() if line.startswith("roformer ")]
    assert len(lines) == 1 and err.strip().endswith(lines[0]) and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 64 KiB mounted for the test (root on Linux); skipped where mounting is not allowed."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root on Linux): {done.stderr.decode().strip()[:100]}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fail_writes(monkeypatch: pytest.MonkeyPatch, name_part: str) -> None:
    """Every file opened for writing (or written whole) whose name contains `name_part` fails with ENOSPC."""
    original_open, original_write_text = pathlib.Path.open, pathlib.Path.write_text

    def check(path: Path, mode: str = "r") -> None:
        if name_part in path.name and any(c in mode for c in "wax"):
            raise OSError(errno.ENOSPC, FULL)  # as a real full disk: no file name in the error

    def open_(self, mode="r", *args, **kwargs):
        check(self, mode)
        return original_open(self, mode, *args, **kwargs)

    def write_text(self, *args, **kwargs):
        check(self, "w")
        return original_write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", open_)
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


# -- what counts as a failed write -------------------------------------------------------------------------------


def test_every_writer_s_full_disk_error_is_recognised(small_disk: Path) -> None:
    tensors = {"w": torch.randn(200, 400)}  # 320 KB: more than the disk holds
    writers = {
        "torch.save": lambda: torch.save(tensors, small_disk / "a.pt"),
        "safetensors": lambda: save_file(tensors, str(small_disk / "a.safetensors")),
        "text": lambda: (small_disk / "a.txt").write_text("x" * 400_000),
        "numpy": lambda: np.zeros(100_000).tofile(small_disk / "a.npy"),
    }
    for name, write in writers.items():
        with pytest.raises(BaseException) as caught:
            write()
        assert is_write_failure(caught.value), (name, caught.value)


@pytest.mark.parametrize(
    "error",
    [FileNotFoundError(errno.ENOENT, "No such file or directory"), RuntimeError("shape mismatch"), ValueError("x")],
)
def test_other_errors_are_not_write_failures(error: BaseException) -> None:
    assert not is_write_failure(error)  # bad input stays exit 2, a bug keeps its traceback


def test_no_permission_is_a_write_failure_and_a_folder_in_the_way_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from roformer.errors import UserError, WriteFailed
    from roformer.files import atomic_write_text

    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match=r"taken: cannot write a file there"):
        atomic_write_text(tmp_path / "taken", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no taken.tmp left behind

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", denied)  # root writes anywhere: the error stands in for chmod
    with pytest.raises(WriteFailed, match=r"a\.txt.*Permission denied"):
        atomic_write_text(tmp_path / "a.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


# -- pretraining's final/ ----------------------------------------------------------------------------------------

FAIL_FINAL = (
    "import safetensors.torch as st, roformer.model.weights as w\n"
    "original = st.save_file\n"
    "def save_file(tensors, filename, *a, **k):\n"
    "    if '/.final.' in filename:\n"
    "        raise OSError(28, 'No space left on device')\n"
    "    return original(tensors, filename, *a, **k)\n"
    "if RANK == 0:\n"
    "    w.save_file = save_file\n"
)


def test_a_full_disk_while_writing_final_is_one_line_and_resume_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import roformer.model.weights as weights

    scope = {"RANK": 1}  # defines the patch without applying it: monkeypatch applies and undoes it
    exec(FAIL_FINAL, scope)  # the same patch as the two-process test's wrapper
    monkeypatch.setattr(weights, "save_file", scope["save_file"])
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=2, save_every=1)
    run = tmp_path / "run"
    code = main(["pretrain", "--config", str(yaml), "--output-dir", str(run)])
    line = one_line(capsys.readouterr().err)
    assert code == 74, line
    assert line.startswith(f"roformer pretrain: stopped: cannot write {run / 'final'} (model.safetensors): ")
    assert FULL in line
    assert "the checkpoint of step 2 is intact: --resume writes final/" in line
    assert not (run / "final").exists() and not list(run.glob(".final.*"))  # nothing half-written
    assert (run / "checkpoints" / "step-2").is_dir()
    monkeypatch.undo()
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 0
    assert (run / "final" / "model.safetensors").is_file()


def test_a_full_disk_while_writing_final_stops_both_processes_in_one_line(tmp_path: Path) -> None:
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=2, save_every=0, eval_every=0, batch_size=2)
    wrapper = write_wrapper(tmp_path / "w.py", FAIL_FINAL)
    run = tmp_path / "run"
    results = launch_two(wrapper, ["pretrain", "--config", str(yaml), "--output-dir", str(run)])
    for code, err in results:
        assert code == 74 and "Traceback" not in err, err[-2000:]
        assert last_line(err).startswith(f"roformer pretrain: stopped: cannot write {run / 'final'} "), err[-500:]
    assert last_line(results[0][1]) == last_line(results[1][1])
    assert not (run / "final").exists()


def test_a_failed_write_no_writer_named_is_74_on_every_process(tmp_path: Path) -> None:
    """The run directory made on a full disk (a bare mkdir in the main process's part): 74 and one line on both."""
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=2, save_every=0, eval_every=0, batch_size=2)
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "import errno, pathlib\n"
        "original = pathlib.Path.mkdir\n"
        "def mkdir(self, *a, **k):\n"
        "    if self.name == 'run':\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device', str(self))\n"
        "    return original(self, *a, **k)\n"
        "if RANK == 0:\n"
        "    pathlib.Path.mkdir = mkdir\n",
    )
    run = tmp_path / "run"
    results = launch_two(wrapper, ["pretrain", "--config", str(yaml), "--output-dir", str(run)])
    for code, err in results:
        assert code == 74 and "Traceback" not in err, err[-2000:]
        assert last_line(err).startswith(f"roformer pretrain: stopped: cannot write {run}: "), err[-500:]
    assert last_line(results[0][1]) == last_line(results[1][1])


# -- the token store ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["prepare-data", "pretrain"])
def test_a_token_store_that_does_not_fit_is_one_line(
    command: str, tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml = tiny_run_config(
        tmp_path / "c.yaml", max_steps=2, data={"builtin_documents": 3000, "cache_dir": str(small_disk)}
    )
    extra = ["--output-dir", str(tmp_path / "run")] if command == "pretrain" else []
    code = main([command, "--config", str(yaml), *extra])
    line = one_line(capsys.readouterr().err)
    assert code == 74, line
    assert line.startswith(f"roformer {command}: stopped: cannot write {small_disk}/") and "disk is full" in line
    assert not [p for p in small_disk.rglob("*") if p.is_file()]  # the unfinished store is removed


# -- convert, export, eval-mlm, compare --------------------------------------------------------------------------


def test_convert_from_hf_into_a_full_disk_keeps_the_previous_output(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture
) -> None:
    hf_dir = tmp_path / "hf"
    make_hf("roformer-mlm").save_pretrained(hf_dir)
    capsys.readouterr()
    out = small_disk / "ours"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier conversion")
    code = main(["convert", "--from-hf", str(hf_dir), "--out", str(out), "--overwrite"])
    line = one_line(capsys.readouterr().err)
    assert code == 74, line
    assert line.startswith(f"roformer convert: stopped: cannot write {out}") and ".tmp" not in line
    assert [p.name for p in small_disk.iterdir()] == ["ours"] and (out / "notes.txt").read_text() == (
        "an earlier conversion"
    )


def test_convert_from_hf_with_a_failing_write_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    hf_dir = tmp_path / "hf"
    make_hf("roformer-mlm").save_pretrained(hf_dir)
    capsys.readouterr()
    fail_writes(monkeypatch, "model.yaml")
    code = main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "ours")])
    line = one_line(capsys.readouterr().err)
    assert code == 74 and line.startswith(f"roformer convert: stopped: cannot write {tmp_path / 'ours'}"), line
    assert not (tmp_path / "ours").exists()


@pytest.fixture
def run(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    return finished_run(tmp_path, capsys)[1]


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "--to-hf", "{run}/final", "--out", "{out}"],
        ["export", "--model", "{run}/final", "--out", "{out}"],
        ["eval-mlm", "--model", "{run}/final", "--seq-lens", "32", "--out", "{out}/lengths.json"],
        ["compare", "{run}", "--out", "{out}"],
    ],
    ids=lambda c: c[0],
)
def test_every_output_into_a_full_disk_is_one_line(
    command: list[str], run: Path, small_disk: Path, capsys: pytest.CaptureFixture
) -> None:
    out = small_disk / "out"
    if command[0] == "eval-mlm":
        out.mkdir()
    with (small_disk / "filler").open("wb") as filler:  # the disk full to the last byte
        try:
            filler.write(b"\0" * (64 * 1024))
            filler.flush()
        except OSError:
            pass
    code = main([part.format(run=run, out=out) for part in command])
    line = one_line(capsys.readouterr().err)
    assert code == 74, line
    assert line.startswith(f"roformer {command[0]}: stopped: cannot write {out}"), line
    assert sorted(p.name for p in small_disk.rglob("*")) == (
        ["filler", "out"] if command[0] == "eval-mlm" else ["filler"]
    )


# -- fine-tuning -------------------------------------------------------------------------------------------------


def test_a_failing_write_while_fine_tuning_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    yaml, pre = finished_run(tmp_path, capsys)
    rows = [("una duo", 1), ("ba ka", 0)] * 20
    files = {}
    for split in ("train", "dev", "test"):
        files[split] = tmp_path / f"{split}.csv"
        header = "sentence,label" if split != "test" else "idx,sentence"
        lines = [f"{s},{label}" if split != "test" else f"{i},{s}" for i, (s, label) in enumerate(rows)]
        files[split].write_text("\n".join([header, *lines]) + "\n")
    config = task_config(tmp_path / "ft.yaml", pre / "final", files, epochs=1, seeds=[0])
    fail_writes(monkeypatch, "dev.tsv")
    out = tmp_path / "ft"
    code = main(["finetune", "--config", str(config), "--output-dir", str(out)])
    line = one_line(capsys.readouterr().err)
    assert code == 74, line
    assert line.startswith(f"roformer finetune: stopped: cannot write {out / 'predictions'}/") and FULL in line
    assert not list(out.rglob("*.tmp"))
