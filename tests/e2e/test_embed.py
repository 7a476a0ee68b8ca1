"""`roformer embed` over several processes: the same vectors, in the same order, as one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import launch_two, write_wrapper

from roformer.cli import main


def test_two_processes_embed_what_one_does(tmp_path: Path, pretrained: Path) -> None:
    """Each process encodes a share of the texts sorted by length; the main process writes them in file order."""
    texts = [" ".join(["word"] * (i % 7 + 1)) + f" number {i}" for i in range(23)]  # odd count: uneven shares
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    args = ["embed", "--model", str(pretrained), "--input", str(tmp_path / "t.txt"), "--batch-size", "4"]
    assert main([*args, "--out", str(tmp_path / "one.npy")]) == 0
    wrapper = write_wrapper(tmp_path / "run.py", "")
    ranks = launch_two(wrapper, [*args, "--out", str(tmp_path / "two.npy")])
    assert [code for code, _ in ranks] == [0, 0], [err[-1500:] for _, err in ranks]
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == (23, 32)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
