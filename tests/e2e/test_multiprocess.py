"""Several processes behave as one (2 CPU processes, gloo): a failure on one rank is every rank's, nothing waits
forever in a collective, the token store is built once per node, the collective timeout is ours; a rank that fails
before the process group forms ends the others within the (short) rendezvous timeout, which SIGTERM interrupts.

The processes are started directly with the torch.distributed environment (what torchrun and accelerate launch
set), so that each one's exit code and stderr can be checked; a wrapper script patches the moment to test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, free_port, last_line, launch_two, tiny_run_config, write_wrapper


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tiny_run_config(tmp_path / "c.yaml", max_steps=4, save_every=2, eval_every=2, batch_size=2,
                           data={"cache_dir": str(tmp_path / "cache")})  # fmt: skip


def test_a_data_error_on_the_main_process_stops_every_process(tmp_path: Path, config: Path) -> None:
    """The main process builds the data first; its one-line error must reach rank 1, waiting for the tokenizer."""
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "import roformer.train.pretrain as p\n"
        "from roformer.errors import UserError\n"
        "def broken(*a, **k):\n"
        "    raise UserError('corpus.txt: not UTF-8 at byte 12')\n"
        "if RANK == 0:\n"
        "    p.build_mlm_data = broken\n",
    )
    results = launch_two(wrapper, ["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "run")])
    assert [code for code, _ in results] == [2, 2], results
    assert all("corpus.txt: not UTF-8 at byte 12" in last_line(err) for _, err in results), results


def test_a_metrics_write_error_on_the_main_process_stops_every_process(tmp_path: Path, config: Path) -> None:
    """Only the main process writes metrics.jsonl: a full disk there is exit 74 on both ranks, not a hang."""
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "import errno\n"
        "from roformer.train.run_dir import MetricsWriter\n"
        "original = MetricsWriter.write\n"
        "def write(self, event):\n"
        "    if event.get('step') == 3:\n"
        "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "    original(self, event)\n"
        "MetricsWriter.write = write\n",
    )
    results = launch_two(wrapper, ["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "run")])
    assert [code for code, _ in results] == [74, 74], results
    assert all("No space left on device" in last_line(err) for _, err in results), results


def test_two_processes_resume_from_the_main_process_listing_and_record_the_extension(
    tmp_path: Path, config: Path
) -> None:
    """Rank 1 lists a checkpoint the main process does not (no shared disk, a stale cache): both must try the main
    process's candidates, or rank 1 would verify one checkpoint more and wait in a collective no one else makes."""
    import yaml

    run = tmp_path / "run"
    args = ["pretrain", "--config", str(config), "--output-dir", str(run)]
    assert [code for code, _ in launch_two(write_wrapper(tmp_path / "plain.py", ""), args)] == [0, 0]
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "from pathlib import Path\n"
        "from roformer.train.checkpoints import CheckpointManager\n"
        "original = CheckpointManager.complete\n"
        "def complete(self):\n"
        "    found = original(self)\n"
        "    return found + [(99, self.directory / 'step-99')] if RANK == 1 else found\n"
        "CheckpointManager.complete = complete\n",
    )
    results = launch_two(wrapper, ["pretrain", "--output-dir", str(run), "--resume", "--set", "train.max_steps=6"])
    assert [code for code, _ in results] == [0, 0], [err[-1500:] for _, err in results]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["max_steps"] == 6  # the accepted extension


def test_the_token_store_is_built_once_when_the_tokenizer_comes_from_a_file(tmp_path: Path, config: Path) -> None:
    """data.tokenizer (and every init: run): rank 1 must not build the same store at the same time as rank 0."""
    from roformer.cli import main

    first = tmp_path / "first"
    assert main(["pretrain", "--config", str(config), "--output-dir", str(first), "--set", "train.max_steps=1"]) == 0
    builds = tmp_path / "builds.txt"
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "import roformer.data.store as store\n"
        "original = store.build_token_store\n"
        "def build(*a, **k):\n"
        f"    with open({str(builds)!r}, 'a') as f:\n"
        "        f.write(f'{RANK}\\n')\n"
        "    return original(*a, **k)\n"
        "store.build_token_store = build\n",
    )
    fresh_cache = ["--set", f"data.cache_dir={tmp_path / 'cache2'}", "--set", f"data.tokenizer={first / 'tokenizer'}"]
    args = ["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "run"), *fresh_cache]
    results = launch_two(wrapper, args)
    assert [code for code, _ in results] == [0, 0], results
    assert builds.read_text().split() == ["0"]  # one node: the main process builds, the other reads the store


def test_the_collective_timeout_is_ours(tmp_path: Path, config: Path) -> None:
    """ROFORMER_COLLECTIVE_TIMEOUT reaches the process group: rank 1 gives up waiting for a slow rank 0."""
    wrapper = write_wrapper(
        tmp_path / "w.py",
        "import time\n"
        "import roformer.train.pretrain as p\n"
        "original = p.build_mlm_data\n"
        "def slow(*a, **k):\n"
        "    time.sleep(12)\n"
        "    return original(*a, **k)\n"
        "if RANK == 0:\n"
        "    p.build_mlm_data = slow\n",
    )
    args = ["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "run")]
    results = launch_two(wrapper, args, env={"ROFORMER_COLLECTIVE_TIMEOUT": "3"}, timeout=120)
    assert results[1][0] != 0, results  # timed out after 3 s instead of gloo's default 30 minutes


def test_the_collective_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from roformer.errors import UserError
    from roformer.train.launch import DEFAULT_COLLECTIVE_TIMEOUT, collective_timeout

    assert collective_timeout().total_seconds() == DEFAULT_COLLECTIVE_TIMEOUT
    monkeypatch.setenv("ROFORMER_COLLECTIVE_TIMEOUT", "90")
    assert collective_timeout().total_seconds() == 90
    monkeypatch.setenv("ROFORMER_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(UserError, match="ROFORMER_COLLECTIVE_TIMEOUT"):
        collective_timeout()


@pytest.mark.parametrize("failing", [1, 0])
def test_a_process_that_fails_before_the_group_forms_ends_the_other_within_the_rendezvous_timeout(
    tmp_path: Path, config: Path, failing: int
) -> None:
    """One rank exits 2 at once (its config is missing on "its node") and never joins the process group: the other,
    rank 0 hosting the store or rank 1 looking for it, gives up after ROFORMER_RENDEZVOUS_TIMEOUT (5 s here), not
    the 4-hour collective timeout, in one line that names it, the address and the setting."""
    wrapper = write_wrapper(
        tmp_path / "w.py",
        f"if RANK == {failing}:\n    sys.argv[sys.argv.index('--config') + 1] = 'missing-on-this-node.yaml'\n",
    )
    args = ["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "run")]
    start = time.monotonic()
    results = launch_two(wrapper, args, env={"ROFORMER_RENDEZVOUS_TIMEOUT": "5"}, timeout=60)
    elapsed = time.monotonic() - start
    assert [code for code, _ in results] == [2, 2], results
    assert "missing-on-this-node.yaml" in last_line(results[failing][1])
    code, err = results[1 - failing]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback, no log of torch's
    assert lines[0].startswith(f"roformer pretrain: error: the process group did not form: rank {1 - failing} of 2")
    assert "127.0.0.1:" in lines[0] and "waited 5 s" in lines[0] and "ROFORMER_RENDEZVOUS_TIMEOUT" in lines[0]
    assert elapsed < 45, elapsed


def test_sigterm_ends_a_process_waiting_for_the_group_at_once(tmp_path: Path, config: Path) -> None:
    """Rank 0 waits for a rank 1 that never starts: SIGTERM ends it at once with the stop code (75), not when the
    wait is over (torch's wait for the others ran in C++, where Python's signal handlers do not run)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "ROFORMER_RENDEZVOUS_TIMEOUT": "120"}  # fmt: skip
    command = [sys.executable, "-m", "roformer", "pretrain", "--config", str(config), "--output-dir"]
    process = subprocess.Popen([*command, "run"], env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until rank 0's store listens: it then waits for rank 1
            assert time.monotonic() < deadline and process.poll() is None, "rank 0 did not start its store"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.5)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert time.monotonic() - signalled < 5
    assert process.returncode == 75, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("roformer pretrain: stopped: stopped by SIGTERM"), err


def test_the_rendezvous_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from roformer.errors import UserError
    from roformer.train.launch import DEFAULT_RENDEZVOUS_TIMEOUT, rendezvous_timeout

    monkeypatch.delenv("ROFORMER_RENDEZVOUS_TIMEOUT", raising=False)
    assert rendezvous_timeout().total_seconds() == DEFAULT_RENDEZVOUS_TIMEOUT
    monkeypatch.setenv("ROFORMER_RENDEZVOUS_TIMEOUT", "7.5")
    assert rendezvous_timeout().total_seconds() == 7.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("ROFORMER_RENDEZVOUS_TIMEOUT", bad)
        with pytest.raises(UserError, match="ROFORMER_RENDEZVOUS_TIMEOUT"):
            rendezvous_timeout()


FSDP_LOAD = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import roformer
from roformer.model.layers import Block
from roformer.train.engine import load_full_state

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
config = roformer.ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
model = roformer.SequenceClassifier(config)
for block in [m for m in model.modules() if isinstance(m, Block)]:
    fully_shard(block)
fully_shard(model)  # FSDP2, as configs/accelerate/fsdp.yaml: parameters become DTensors
state = {k: torch.randn_like(v.full_tensor()) for k, v in model.state_dict().items()}
load_full_state(model, state, sharded=True)
assert all(type(v) is torch.Tensor for v in state.values()), "the caller's dict now holds shards"
roformer.SequenceClassifier(config).load_state_dict(state)  # what fine-tuning does next: the best model's copy
for name, value in model.state_dict().items():
    torch.testing.assert_close(value.full_tensor(), state[name])
dist.destroy_process_group()
"""


def test_full_weights_loaded_into_an_fsdp_model_stay_full_for_the_caller() -> None:
    """Found on an H200: fine-tuning under FSDP loaded the best weights back into the sharded model, and torch's
    distributed loader swapped the dict's tensors for DTensor shards, so saving the best model from them failed."""
    done = subprocess.run([sys.executable, "-c", FSDP_LOAD, str(free_port())], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
