"""Elastic resume: a run stopped on N processes continues on M under the same global batch (docs/resuming.md).

Every case compares with a run that was never stopped: pretraining stopped on 2 processes, resumed on 1, stopped
again and finished on 3, dropout on; a fine-tuning run stopped on 2 and finished on 1; a streamed corpus whose
position at the stop is the uninterrupted run's, document for document; FSDP2 model and optimizer shards written by 2
processes and read by 1 and by 3 (torch's distributed checkpoint, gloo on CPU). Batch_size stays, grad_accum takes
up the change (the exact way); another batch_size is said in one line. The processes are started directly with the
torch.distributed environment (helpers.launch_processes); a wrapper stops the main process after a given step with
SIGTERM, as a scheduler would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import launch_processes, stop_after, stop_in_process, task_config, tiny_run_config, write_wrapper

from roformer.cli import main
from roformer.config_yaml import read_yaml, write_yaml
from roformer.data.builtin import generate_documents
from roformer.train.checkpoints import CheckpointManager
from roformer.train.run_dir import read_metrics

DROPOUT = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
TIMING = {"tokens_per_sec", "elapsed_sec", "data_fraction"}


def events(run: Path) -> list[dict]:
    """The run's train and eval events, without their timings (and without the stop records of a resumed run)."""
    found = [e for e in read_metrics(run / "metrics.jsonl") if e["event"] in ("train", "eval")]
    return [{k: v for k, v in e.items() if k not in TIMING} for e in found]


def assert_same_events(run: Path, reference: Path, tolerance: float = 1e-5) -> float:
    """Equal events, step for step, numbers within `tolerance` (float sums over other shapes); returns the largest
    difference of a logged loss."""
    ours, theirs = events(run), events(reference)
    assert [(e["event"], e["step"]) for e in ours] == [(e["event"], e["step"]) for e in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.keys() == other.keys()
        for key, value in mine.items():
            if isinstance(value, float):
                assert value == pytest.approx(other[key], abs=tolerance, rel=tolerance), (mine["step"], key)
            else:
                assert value == other[key], (mine["step"], key)
    return max(abs(a["loss"] - b["loss"]) for a, b in zip(ours, theirs, strict=True) if a["event"] == "train")


def launch(count: int, wrapper: Path, args: list[str], code: int) -> str:
    """`roformer ARGS` on `count` processes; every one must exit `code`; returns the main process's stderr."""
    results = launch_processes(count, wrapper, args, timeout=240)
    assert [c for c, _ in results] == [code] * count, [err[-2000:] for _, err in results]
    return results[0][1]


@pytest.mark.slow
def test_pretraining_stopped_on_two_resumed_on_one_and_finished_on_three_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Global batch 12 = batch_size 2 x processes x micro-batches (2 x 3, then 1 x 6, then 3 x 2), dropout on: the
    logged losses are the uninterrupted run's (1 x 6) at every step, and neither resume warns (the same chunks of 2
    examples, so the same dropout masks)."""
    yaml = tiny_run_config(
        tmp_path / "c.yaml", model=DROPOUT, max_steps=10, batch_size=2, grad_accum=3, save_every=0, eval_every=5
    )
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(full), "--set", "train.grad_accum=6"]) == 0
    args = ["pretrain", "--config", str(yaml), "--output-dir", str(cut)]
    launch(2, stop_after(tmp_path / "stop3.py", 3), args, 75)
    with monkeypatch.context() as patch:
        stop_in_process(patch, 7)
        assert main(["pretrain", "--output-dir", str(cut), "--resume", "--set", "train.grad_accum=6"]) == 75
    assert "another layout" not in capsys.readouterr().err
    err = launch(3, write_wrapper(tmp_path / "go.py", ""), [*args, "--resume", "--set", "train.grad_accum=2"], 0)
    assert "another layout" not in err and "resumed from" in err
    assert [e["step"] for e in read_metrics(cut / "metrics.jsonl") if e["event"] == "stopped"] == [3, 7]
    assert assert_same_events(cut, full) < 1e-5


def test_a_resume_under_another_batch_size_says_once_what_does_not_carry_over(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Dropout masks are drawn per micro-batch of batch_size examples: another batch_size draws others (one warning
    line); another global batch is refused in one line that names the grad_accum keeping this batch_size."""
    yaml = tiny_run_config(tmp_path / "c.yaml", model=DROPOUT, max_steps=4, batch_size=4, save_every=0)
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        stop_in_process(patch, 2)
        assert main(["pretrain", "--config", str(yaml), "--output-dir", str(out)]) == 75
    capsys.readouterr()
    assert main(["pretrain", "--output-dir", str(out), "--resume", "--set", "train.batch_size=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "global batch of 4 examples, now 2" in err[0], err
    assert "--set train.grad_accum=2 gives it here" in err[0]
    caplog.clear()
    resume = ["pretrain", "--output-dir", str(out), "--resume", "--set", "train.batch_size=2"]
    assert main([*resume, "--set", "train.grad_accum=2"]) == 0
    notices = [r.getMessage() for r in caplog.records if "another layout" in r.getMessage()]
    assert len(notices) == 1, notices
    assert "batch_size 4 -> 2, grad_accum 1 -> 2" in notices[0] and "dropout masks" in notices[0]
    assert "keep train.batch_size=4" in notices[0]


def test_finetuning_stopped_on_two_processes_finishes_on_one(
    tmp_path: Path,
    pretrained: Path,
    number_task: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """A classification run (dropout on) stopped by SIGTERM on 2 processes x batch 2 x 2 micro-batches and resumed on
    1 process x batch 2 x 4 micro-batches: its events, its result and its best model are the uninterrupted run's.
    Every task type plans its steps alike (tests/e2e/test_finetune_contract.py, layout-free steps per type)."""
    yaml = task_config(
        tmp_path / "c.yaml", pretrained, number_task, model=DROPOUT, max_steps=8, batch_size=2, grad_accum=2,
        seeds=[0], log_every=1, eval_every=4, save_every=0,
    )  # fmt: skip
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["finetune", "--config", str(yaml), "--output-dir", str(full), "--set", "train.grad_accum=4"]) == 0
    launch(2, stop_after(tmp_path / "stop.py", 3), ["finetune", "--config", str(yaml), "--output-dir", str(cut)], 75)
    assert (cut / ".progress" / "lr0.001-seed0" / "checkpoints" / "step-3").is_dir()
    capsys.readouterr()
    assert main(["finetune", "--output-dir", str(cut), "--resume", "--set", "train.grad_accum=4"]) == 0
    assert "another layout" not in capsys.readouterr().err
    assert assert_same_events(cut, full) < 1e-5
    results = [json.loads((run / "results.json").read_text()) for run in (cut, full)]
    assert results[0]["selected"] == results[1]["selected"]
    for split, metrics in results[1]["runs"][0]["dev"].items():
        assert results[0]["runs"][0]["dev"][split] == pytest.approx(metrics, abs=1e-6)


def stream_config(tmp_path: Path, **train) -> Path:
    """A tiny pretraining config that streams a 300-document JSON-lines corpus through a shuffle buffer."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in generate_documents(300, seed=5)))
    data = {"source": "text", "paths": [str(corpus)], "streaming": True, "stream_validation_documents": 20,
            "shuffle_buffer": 50}  # fmt: skip
    return tiny_run_config(tmp_path / "stream.yaml", data=data, **train)


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_a_streamed_corpus_resumes_at_the_same_document_on_another_process_count(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every process reads the whole stream and packs the global batch (its rows are then shared out), so the
    stream's position is one for all: stopped after step 3 on 2 processes, the checkpoint holds the uninterrupted
    1-process run's position (epoch, documents consumed, the tokens carried into the next block), and the resumed run
    on 1 process logs its losses."""
    yaml = stream_config(tmp_path, max_steps=6, batch_size=4, grad_accum=1, save_every=3, eval_every=3,
                         keep_checkpoints=3)  # fmt: skip
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(full), "--set", "train.grad_accum=2"]) == 0
    args = ["pretrain", "--config", str(yaml), "--output-dir", str(cut), "--set", "train.save_every=0"]
    launch(2, stop_after(tmp_path / "stop.py", 3), args, 75)

    def position(run: Path) -> dict:
        return json.loads((run / "checkpoints" / "step-3" / "trainer_state.json").read_text())["data_state"]

    assert position(cut) == position(full) and position(cut)["consumed"] > 0
    assert main(["pretrain", "--output-dir", str(cut), "--resume", "--set", "train.grad_accum=2"]) == 0
    assert assert_same_events(cut, full) < 1e-5


FSDP_CHECKPOINT = """
import os, sys, torch
from pathlib import Path
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
import roformer
from roformer.model.layers import Block
from roformer.train.config import TrainArgs
from roformer.train.engine import Engine
from roformer.train.interval import Interval, RunState
from roformer.train.optim import make_optimizer

mode, out = sys.argv[1], Path(sys.argv[2])
if "WORLD_SIZE" not in os.environ:  # one process: FSDP2 still needs a process group (of one)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
engine = Engine(TrainArgs(batch_size=6 // int(os.environ.get("WORLD_SIZE", "1")), progress=False), out, 0,
                out / "checkpoints", out / "metrics.jsonl")
rank, world = engine.accelerator.process_index, engine.accelerator.num_processes
config = roformer.ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                              num_labels=3, hidden_dropout=0.0, attention_dropout=0.0)
torch.manual_seed(0 if mode == "save" else 1)  # the loading launches start from other weights
model = roformer.SequenceClassifier(config)
for block in [m for m in model.modules() if isinstance(m, Block)]:
    fully_shard(block)
fully_shard(model)  # FSDP2 (configs/accelerate/fsdp.yaml): every parameter a DTensor, 1/world of it here
optimizer, scheduler = make_optimizer(model, 1e-2, 0.01, (0.9, 0.999), 1e-6, 1, 10)
engine.model, engine.optimizer, engine.scheduler = model, optimizer, scheduler  # what setup's prepare gives
engine.interval, engine.total_steps = Interval(), 10


class Recipe:  # what a recipe adds to a checkpoint: nothing here, and no stages
    stages = ()
    def save_checkpoint_state(self, directory): return {}
    def load_checkpoint_state(self, directory, state, step): pass
    def micro_batch_loss(self): return None


def full_state():
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=True)
    weights, moments = get_state_dict(model, optimizer, options=options)
    return {"model": weights, "optimizer": moments, "schedule": scheduler.state_dict()}


if mode == "save":
    generator = torch.Generator().manual_seed(3)
    for step in range(2):
        ids = torch.randint(1, 100, (6, 12), generator=generator)
        labels = torch.randint(0, 3, (6,), generator=generator)
        rows = slice(rank * 6 // world, (rank + 1) * 6 // world)
        model(input_ids=ids[rows], labels=labels[rows]).loss.backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
    engine.save_checkpoint(Recipe(), RunState(step=2))
    state = full_state()
    if rank == 0:
        torch.save(state, out / "saved.pt")
else:
    assert engine._load_latest_checkpoint(Recipe()).step == 2
    state = full_state()
    if rank == 0:
        saved = torch.load(out / "saved.pt", weights_only=False)
        for part in ("model", "optimizer"):
            assert state[part].keys() == saved[part].keys(), part
            for key, value in state[part].items():
                same = torch.equal(value, saved[part][key]) if torch.is_tensor(value) else value == saved[part][key]
                assert same, (part, key)
        assert state["schedule"] == saved["schedule"]
        assert engine.accelerator.step == 2  # accelerate's micro-step count, set from the step (grad_accum 1)
        print(f"loaded on {world}: {len(state['model'])} tensors, {len(state['optimizer'])} optimizer entries",
              file=sys.stderr)
"""


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_fsdp2_state_saved_on_two_processes_loads_on_one_and_on_three(tmp_path: Path) -> None:
    """The engine's checkpoint of an FSDP2 model (every parameter and moment a DTensor slice) goes through torch's
    distributed checkpoint, which reshards on load: written by 2 gloo processes after 2 AdamW steps, read by 1 and by
    3 (the 2-row token-type table leaves the third process an empty slice), model, optimizer and schedule equal the
    saved ones exactly. The launches take the model from other weights, so a silent non-load would show."""
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP_CHECKPOINT)
    out = tmp_path / "run"
    launch(2, script, ["save", str(out)], 0)
    checkpoint = out / "checkpoints" / "step-2"
    files = {p.name for p in (checkpoint / "sharded").iterdir()}
    assert files == {".metadata", "__0_0.distcp", "__1_0.distcp"}, files  # one file of slices per process
    assert not (checkpoint / "model.safetensors").exists() and (checkpoint / "custom_checkpoint_0.pkl").is_file()
    assert CheckpointManager(out / "checkpoints").verify(checkpoint) is None  # the shards are in the manifest
    for count in (1, 3):
        assert f"loaded on {count}: 32 tensors" in launch(count, script, ["load", str(out)], 0)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process without a group: DCP says so
def test_a_damaged_shard_is_a_damaged_checkpoint(tmp_path: Path) -> None:
    """A shard file that fails to load (its manifest passing) makes the checkpoint one to skip, not a traceback:
    torch's CheckpointException is a BaseException, which the fallback to an older checkpoint would not catch."""
    import torch

    from roformer.train.sharded import load_sharded_state, save_sharded_state

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_sharded_state(model, optimizer, tmp_path / "sharded")
    (tmp_path / "sharded" / "__0_0.distcp").write_bytes(b"\0" * 16)
    with pytest.raises(RuntimeError, match=r"sharded: rank 0: "):
        load_sharded_state(model, optimizer, tmp_path / "sharded")


def test_pretraining_in_stages_stopped_on_two_processes_inside_its_second_stage_finishes_on_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Named stages under a two-process launch: 4 steps at 32 tokens (global batch 4 = 2 x 2 processes, then 2 x 1 x
    grad_accum 2), then 4 at 64 tokens with batch_size 1 (global 2). Stopped on 2 processes after step 6, inside the
    second stage, resumed on 1: the logged losses and evaluations are the uninterrupted one-process run's, dropout on,
    and both runs leave each stage's folder."""
    yaml = tiny_run_config(tmp_path / "c.yaml", model=DROPOUT, batch_size=2, save_every=0, eval_every=4)
    config = read_yaml(yaml)
    config["train"].pop("max_steps")
    config["stages"] = [
        {"name": "short", "steps": 4},
        {"name": "long", "steps": 4, "data": {"max_seq_len": 64}, "train": {"batch_size": 1}},
    ]
    write_yaml(yaml, config)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(full), "--set", "train.grad_accum=2"]) == 0
    launch(2, stop_after(tmp_path / "stop6.py", 6), ["pretrain", "--config", str(yaml), "--output-dir", str(cut)], 75)
    capsys.readouterr()
    assert main(["pretrain", "--output-dir", str(cut), "--resume", "--set", "train.grad_accum=2"]) == 0
    assert "another layout" not in capsys.readouterr().err
    assert [e["step"] for e in read_metrics(cut / "metrics.jsonl") if e["event"] == "stopped"] == [6]
    assert [e["stage"] for e in events(cut) if e["event"] == "train"] == ["short"] * 4 + ["long"] * 4
    assert assert_same_events(cut, full) < 1e-5
    for run in (full, cut):
        assert (run / "stages" / "short" / "model.safetensors").is_file()
        assert (run / "stages" / "long" / "model.safetensors").is_file()
