"""scripts/gpu/gpu_check.sh end to end at toy sizes (GPU_CHECK_SMOKE=1): the plumbing of the GPU session, on a CPU."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import REPO


@pytest.mark.slow
def test_gpu_check_smoke_run_prints_one_report(tmp_path: Path) -> None:
    """~2 minutes on 2 cores: gpu tests (skipped here), eager benchmarks, both arms' pretraining, the report."""
    env = {
        **os.environ,
        "GPU_CHECK_SMOKE": "1",
        "GPU_CHECK_MODES": "eager",
        "OUT": str(tmp_path / "out"),
        "GPU_CHECK_WORK": str(tmp_path / "work"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        ["bash", "scripts/gpu/gpu_check.sh", "all"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "out" / "gpu-report.md").read_text()
    assert "GPU tests: " in report and "| eager | 64 x 4 | ours-rotary |" in report
    assert "| 64 x 4 | alibi |" in report and "| Shaw: distinct rows + gather (ours) |" in report
    assert "| 64 x 4 | rotary-unfused |" in report and "| packed, isolated documents (mask) |" in report
    rows = [line.split("|") for line in report.splitlines() if line.startswith(("| roformer |", "| bert |"))]
    assert len(rows) == 2 and all(row[-2].strip() == "0" for row in rows), report  # no non-finite loss
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"device.txt", "bench-eager.json", "base-summary.json"}


@pytest.mark.slow
def test_gpu_check_lease_stops_at_its_deadline_and_returns_one_archive(tmp_path: Path) -> None:
    """`lease`: one device call; stages past the deadline are cut or skipped, and $OUT holds few files (the device
    tool returns at most 8): the results travel as results.tgz, whatever finished in time inside it."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_SMOKE": "1", "GPU_CHECK_SECONDS": "75", "OUT": str(out),
           "GPU_CHECK_WORK": str(tmp_path / "work"), "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run(
        ["bash", "scripts/gpu/gpu_check.sh", "lease"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== skipped (no time left)" in done.stdout, done.stdout
    assert {p.name for p in out.iterdir()} == {"device.txt", "results.tgz"}
    with tarfile.open(out / "results.tgz") as archive:
        names = {Path(name).name for name in archive.getnames()}
    assert {"device.txt", "bench-eager.json", "gpu-report.md"} <= names, names
