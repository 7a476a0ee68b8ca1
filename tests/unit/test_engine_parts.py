"""The training engine's parts, each alone: optimizer groups and schedules, the non-finite step guard, atomic
checkpoints and which one every process resumes from, the metrics file, sharded evaluation, launcher settings and
the accelerator."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

import roformer
from roformer.errors import ConfigError, UserError
from roformer.train.checkpoints import CheckpointManager
from roformer.train.optim import lr_multiplier, param_groups
from roformer.train.run_dir import MetricsWriter, read_metrics


def test_weight_decay_only_on_matrices() -> None:
    model = roformer.MaskedLM(tiny_config(position_encoding="sinusoidal", sinusoidal_scale_learned=True))
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert "backbone.embeddings.word.weight" in decayed and "backbone.layers.0.attn.qkv.weight" in decayed
    assert "backbone.embeddings.sinusoidal.scale" not in decayed and "decoder_bias" not in decayed
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_schedules(schedule: str) -> None:
    values = [lr_multiplier(s, 10, 100, schedule) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert max(values) == pytest.approx(1.0)
    if schedule == "constant":
        assert values[-1] == 1.0
    else:
        assert values[10] == pytest.approx(1.0) and values[-1] < 0.05
        assert all(a >= b for a, b in zip(values[10:], values[11:]))
    assert lr_multiplier(55, 10, 100, "linear") == pytest.approx(0.5)
    assert lr_multiplier(55, 10, 100, "cosine") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_multiplier(0, 1, 10, "step")


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_warmup_stable_decay(shape: str) -> None:
    """`wsd`: warmup 10, the peak held to step 79, then 20 steps decaying in `shape` (1-sqrt: Hägele et al. 2024)."""
    values = [lr_multiplier(s, 10, 100, "wsd", 20, shape) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9:80] == [1.0] * 71  # warmup, then stable
    decay = values[80:]
    assert decay[0] == 1.0 and all(a > b for a, b in zip(decay, decay[1:])) and decay[-1] > 0  # to 0 after the run
    expected = {"linear": 1 - 0.5, "cosine": 0.5 * (1 + math.cos(math.pi * 0.5)), "1-sqrt": 1 - math.sqrt(0.5)}
    assert lr_multiplier(90, 10, 100, "wsd", 20, shape) == pytest.approx(expected[shape])  # half-way through
    # a decay longer than what follows warmup starts where warmup ends
    assert lr_multiplier(10, 10, 20, "wsd", 15, shape) == 1.0 and lr_multiplier(15, 10, 20, "wsd", 15, shape) < 1
    with pytest.raises(ValueError, match="unknown decay shape"):
        lr_multiplier(90, 10, 100, "wsd", 20, "step")


def test_inverse_sqrt_is_its_formula() -> None:
    """lr = peak * min(s / warmup, sqrt(warmup / s)) at update s = step + 1 (Vaswani et al. 2017; fairseq's)."""
    warmup = 40
    for step in range(500):
        s = step + 1
        expected = min(s / warmup, math.sqrt(warmup / s))
        assert lr_multiplier(step, warmup, 10, "inverse_sqrt") == pytest.approx(expected, rel=1e-12)
    assert lr_multiplier(warmup - 1, warmup, 10, "inverse_sqrt") == 1.0  # the peak at the warmup's last update
    assert lr_multiplier(4 * warmup - 1, warmup, 10, "inverse_sqrt") == pytest.approx(0.5)  # 1/sqrt(4) later
    with pytest.raises(ValueError, match="needs warmup_steps"):
        lr_multiplier(5, 0, 10, "inverse_sqrt")


def test_inverse_sqrt_needs_a_warmup() -> None:
    from roformer.config import from_dict
    from roformer.errors import ConfigError
    from roformer.train.config import FinetuneTrainConfig

    assert from_dict(FinetuneTrainConfig, {"schedule": "inverse_sqrt", "warmup_steps": 10}).warmup_for(5) == 10
    with pytest.raises(ConfigError, match="inverse_sqrt needs a warmup"):
        from_dict(FinetuneTrainConfig, {"schedule": "inverse_sqrt", "warmup_steps": 0})


def test_the_wsd_settings_are_checked() -> None:
    from roformer.config import from_dict
    from roformer.train.config import TrainConfig

    config = from_dict(TrainConfig, {"schedule": "wsd", "decay_fraction": 0.25, "decay_shape": "cosine"})
    assert config.decay_for(100) == 25 and config.decay_for(2) == 1
    with pytest.raises(ConfigError, match=r"decay_fraction must be in \(0, 1\], got 0"):
        from_dict(TrainConfig, {"schedule": "wsd", "decay_fraction": 0})
    with pytest.raises(ConfigError, match="decay_shape"):
        from_dict(TrainConfig, {"decay_shape": "sqrt"})


def save_checkpoint(manager: CheckpointManager, step: int, write: Callable[[Path], object]) -> Path:
    """Write a checkpoint as the engine does: begin, fill the hidden directory, commit."""
    write(manager.begin(step))
    return manager.commit(step)


def test_checkpoints_keep_last_k(tmp_path) -> None:
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    assert manager.latest() is None
    for step in (10, 20, 30):
        save_checkpoint(manager, step, lambda d, s=step: (d / "state.json").write_text(json.dumps({"step": s})))
    assert [s for s, _ in manager.complete()] == [20, 30]
    step, path = manager.latest()
    assert step == 30 and json.loads((path / "state.json").read_text()) == {"step": 30}


def test_killed_checkpoint_write_is_ignored(tmp_path) -> None:
    """A process killed while writing a checkpoint leaves nothing that `latest()` picks up."""
    directory = tmp_path / "checkpoints"
    save_checkpoint(CheckpointManager(directory), 10, lambda d: (d / "state.json").write_text("{}"))
    script = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from roformer.train.checkpoints import CheckpointManager
        def write(d: Path) -> None:
            (d / "part1").write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
        manager = CheckpointManager({str(directory)!r})
        write(manager.begin(20))
        manager.commit(20)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL
    assert (directory / ".tmp-step-20").is_dir()  # the torn write is there ...
    manager = CheckpointManager(directory)
    assert manager.latest()[0] == 10  # ... and ignored
    (directory / "step-30").mkdir()  # a directory without the completion marker is ignored too
    assert manager.latest()[0] == 10
    save_checkpoint(manager, 40, lambda d: None)
    assert not (directory / ".tmp-step-20").exists() and manager.latest()[0] == 40


def test_metrics_jsonl(tmp_path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        writer.write({"step": 1, "loss": torch.tensor(2.5)})
        writer.write({"step": 2, "eval_loss": 2.0})
    with MetricsWriter(path) as writer:  # appends (resume)
        writer.write({"step": 3, "loss": 1.5})
    assert [e["step"] for e in read_metrics(path)] == [1, 2, 3]
    with path.open("a") as f:
        f.write('{"step": 4, "lo')  # torn by a kill
    assert len(read_metrics(path)) == 3
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UserError, match="metrics.jsonl:2: not a JSON line"):
        read_metrics(path)
    assert os.path.getsize(path) > 0


@pytest.mark.parametrize("rows,batch,processes", [(10, 3, 3), (7, 2, 2), (1, 4, 2), (0, 2, 2), (33, 4, 8), (5, 8, 4)])
def test_every_process_runs_the_same_number_of_eval_forwards(rows: int, batch: int, processes: int) -> None:
    """Under FSDP each forward is a collective: unequal forward counts across processes deadlock."""
    from roformer.train.evaluate import eval_chunks

    chunks = [eval_chunks(rows, batch, rank, processes) for rank in range(processes)]
    assert len({len(c) for c in chunks}) == 1
    covered = [i for c in chunks for chunk in c if chunk is not None for i in chunk.tolist()]
    assert covered == list(range(rows))  # every row once, in order
    assert all(chunk is None or 0 < len(chunk) <= batch for c in chunks for chunk in c)


def test_sharded_mlm_eval_runs_equal_forwards_and_matches_one_process() -> None:
    """A chunk without masked tokens and an uneven split still cost every process the same forwards."""
    from roformer.train.evaluate import evaluate_mlm

    torch.manual_seed(0)
    model = roformer.MaskedLM(tiny_config(hidden_dropout=0.0, attention_dropout=0.0))
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.randint(5, 101, (7, 12))
    labels = torch.full_like(ids, -100)
    labels[[0, 1, 4, 5, 6], 3] = ids[[0, 1, 4, 5, 6], 3]  # rows 2 and 3 (rank 0's second chunk) have no masks
    single = evaluate_mlm(model, ids, labels, 2, torch.device("cpu"))
    totals, forwards = [], []
    for rank in range(2):
        calls.clear()
        part = evaluate_mlm(model, ids, labels, 2, torch.device("cpu"), rank, 2)
        forwards.append(len(calls))
        totals.append((part["eval_loss"] * part["eval_tokens"], part["eval_tokens"]))
    assert forwards == [2, 2]
    loss = sum(t[0] for t in totals) / sum(t[1] for t in totals)
    assert abs(loss - single["eval_loss"]) < 1e-6 and sum(t[1] for t in totals) == single["eval_tokens"] == 5


def test_launcher_settings_that_contradict_the_train_section_are_refused() -> None:
    """accelerate lets a launcher's gradient_accumulation_steps (and DeepSpeed clipping) win silently."""
    from roformer.train.config import TrainConfig
    from roformer.train.launch import check_launcher_settings

    args = TrainConfig(grad_accum=8, max_grad_norm=1.0)
    check_launcher_settings(args, {})  # no launcher
    check_launcher_settings(args, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "8"})
    with pytest.raises(UserError, match="gradient_accumulation_steps=1 but train.grad_accum=8"):
        check_launcher_settings(args, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1"})
    deepspeed = {"ACCELERATE_USE_DEEPSPEED": "true"}
    check_launcher_settings(args, {**deepspeed, "ACCELERATE_GRADIENT_CLIPPING": "1.0"})
    with pytest.raises(UserError, match="gradient_clipping=0.5 but train.max_grad_norm=1.0"):
        check_launcher_settings(args, {**deepspeed, "ACCELERATE_GRADIENT_CLIPPING": "0.5"})
    with pytest.raises(UserError, match="gradient_clipping"):
        check_launcher_settings(TrainConfig(max_grad_norm=None), {**deepspeed, "ACCELERATE_GRADIENT_CLIPPING": "1.0"})


def test_deepspeed_auto_values_come_from_the_train_section() -> None:
    """No dataloader goes through prepare, so DeepSpeed's `auto` micro-batch must be filled by us."""
    from roformer.train.config import TrainConfig
    from roformer.train.launch import fill_deepspeed_config

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {}}
    fill_deepspeed_config(config, TrainConfig(batch_size=16, grad_accum=4, max_grad_norm=None))
    assert config["train_micro_batch_size_per_gpu"] == 16 and config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 0.0  # no clipping, not accelerate's default 1.0
    explicit = {"gradient_clipping": 0.5}
    fill_deepspeed_config(explicit, TrainConfig())
    assert explicit["gradient_clipping"] == 0.5


def test_mixed_precision_null_takes_the_launchers_value(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from roformer.train.config import TrainConfig
    from roformer.train.launch import make_accelerator

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert make_accelerator(TrainConfig(), tmp_path).mixed_precision == "bf16"
    assert make_accelerator(TrainConfig(mixed_precision="no"), tmp_path).mixed_precision == "no"
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert make_accelerator(TrainConfig(), tmp_path).mixed_precision == "no"


def test_eval_sums_avoid_float64_on_mps() -> None:
    from roformer.train.evaluate import accumulator_dtype

    assert accumulator_dtype(torch.device("mps")) == torch.float32
    assert accumulator_dtype(torch.device("cpu")) == accumulator_dtype(torch.device("cuda")) == torch.float64


@pytest.mark.parametrize("guard", [True, False])
def test_a_non_finite_gradient_skips_the_update_only_when_guarded(guard: bool, tmp_path) -> None:
    """The engine guards every precision but fp16, whose loss scaler skips such steps itself (not twice)."""
    from roformer.train.config import TrainConfig
    from roformer.train.launch import make_accelerator
    from roformer.train.optim import finish_micro_step, make_optimizer

    accelerator = make_accelerator(TrainConfig(), tmp_path)
    model = torch.nn.Linear(3, 2)
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, (0.9, 0.999), 1e-8, 0, 10, "constant")
    model, optimizer = accelerator.prepare(model, optimizer)
    before = model.weight.detach().clone()
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 3)).sum() * float("nan"))
        norm, skipped = finish_micro_step(accelerator, model, optimizer, scheduler, 1.0, guard)
    assert skipped is guard and norm != norm  # NaN norm either way
    assert torch.equal(model.weight, before) is guard  # unguarded, the NaN update goes through
    assert scheduler.last_epoch == 1  # the schedule advances with the step either way


def test_fused_adamw_only_where_cuda_is() -> None:
    from roformer.train.optim import make_optimizer

    model = torch.nn.Linear(3, 2)
    optimizer, _ = make_optimizer(model, 1e-3, 0.0, (0.9, 0.999), 1e-8, 0, 10)
    assert bool(optimizer.defaults.get("fused")) == torch.cuda.is_available()


def test_fp16_steps_skipped_by_the_loss_scaler_are_reported() -> None:
    """With a fused AdamW accelerate cannot see the scaler's skips (optimizer_step_was_skipped stays false): the
    lowered scale tells, so skips count towards max_bad_steps and the schedule still advances."""
    from roformer.train.optim import finish_micro_step

    class Scaler:  # torch.amp.GradScaler's contract: a step with inf gradients is skipped and the scale halved
        def __init__(self) -> None:
            self.scale = 65536.0

        def get_scale(self) -> float:
            return self.scale

    class Optimizer:
        def __init__(self, scaler: Scaler, overflow: bool) -> None:
            self.scaler, self.overflow, self.steps = scaler, overflow, 0

        def step(self) -> None:
            if self.overflow:
                self.scaler.scale /= 2
            else:
                self.steps += 1

        def zero_grad(self, set_to_none: bool = True) -> None:
            pass

    class Scheduler:
        steps = 0

        def step(self) -> None:
            self.steps += 1

    class Accelerator:
        sync_gradients, optimizer_step_was_skipped = True, False

        def __init__(self, scaler: Scaler) -> None:
            self.scaler = scaler

        def clip_grad_norm_(self, parameters, max_norm):
            return torch.tensor(float("inf") if optimizer.overflow else 1.5)

    for overflow in (True, False):
        scaler, scheduler = Scaler(), Scheduler()
        optimizer = Optimizer(scaler, overflow)
        model = torch.nn.Linear(1, 1)
        norm, skipped = finish_micro_step(Accelerator(scaler), model, optimizer, scheduler, 1.0, guard=False)
        assert skipped is overflow and scheduler.steps == 1 and optimizer.steps == (0 if overflow else 1)
        assert (norm == float("inf")) is overflow


def test_processes_agree_on_which_checkpoint_to_resume(tmp_path) -> None:
    """A checkpoint that one process cannot use is skipped by all (FSDP's load is a collective): `agree` decides."""
    from roformer.train.checkpoints import CheckpointManager

    manager = CheckpointManager(tmp_path, keep=3)
    for step in (2, 4):
        save_checkpoint(manager, step, lambda d: (d / "state.json").write_text("{}"))
    loaded = []

    told = []

    def other_rank_fails_at_4(problem):  # this process's verdict joined with rank 1's, which cannot load step-4
        if [p.name for p in loaded] == ["step-4"] and not told:
            told.append(True)
            return problem or "cannot be loaded on rank 1"
        return problem

    assert manager.latest_intact(load=loaded.append, agree=other_rank_fails_at_4)[0] == 2
    assert [p.name for p in loaded] == ["step-4", "step-2"]  # tried together, skipped together


def test_processes_try_the_main_process_candidates_and_all_stop_on_out_of_memory(tmp_path) -> None:
    """A process that lists another checkpoint (no shared disk) tries the main process's list; an out-of-memory load
    on one process is every process's one-line error, not one process raising while the others wait."""
    import torch

    from roformer.errors import CheckpointError
    from roformer.train.checkpoints import CheckpointManager, first_problem

    manager = CheckpointManager(tmp_path, keep=3)
    for step in (2, 4, 6):
        save_checkpoint(manager, step, lambda d: (d / "state.json").write_text("{}"))
    main_listing = [(s, p) for s, p in manager.complete() if s != 6]  # the main process does not see step-6 yet
    loaded = []
    assert manager.latest_intact(load=loaded.append, share=lambda found: main_listing)[0] == 4
    assert [p.name for p in loaded] == ["step-4"]

    def out_of_memory(path):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    verdicts = []
    with pytest.raises(CheckpointError, match="step-6: out of memory while loading .*not a damaged checkpoint"):
        manager.latest_intact(load=out_of_memory, agree=lambda problem: verdicts.append(problem) or problem)
    assert verdicts[-1].startswith("out of memory")  # agreed on (a collective every process makes), then raised
    # the verdicts of every process as one: out of memory on any rank wins over another rank's "cannot be loaded"
    assert first_problem(["cannot be loaded (EOFError)", "out of memory while loading (...)"]).startswith("out of")
    assert first_problem([None, "cannot be loaded (EOFError)"]) == "cannot be loaded (EOFError)"
    assert first_problem([None, None]) is None


def test_an_fsdp_launch_without_a_gpu_is_refused_not_run_as_plain_data_parallel(tmp_path, monkeypatch) -> None:
    """accelerate 1.15 drops an FSDP config on CPU process groups (MULTI_CPU) without a word: we say so instead."""
    import torch

    from roformer.errors import UserError
    from roformer.train.config import TrainConfig
    from roformer.train.launch import make_accelerator

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: FSDP applies")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserError, match="FSDP, which accelerate runs only on GPUs"):
        make_accelerator(TrainConfig(), tmp_path)


def test_the_global_torch_flags_are_set_by_the_function_named_for_them(tmp_path: Path) -> None:
    """Building an accelerator leaves torch's process-wide settings alone; the engine sets them with set_torch_flags."""
    from roformer.train.config import TrainConfig
    from roformer.train.launch import make_accelerator, set_torch_flags

    assert not torch.are_deterministic_algorithms_enabled()
    try:
        make_accelerator(TrainConfig(deterministic=True), tmp_path)
        assert not torch.are_deterministic_algorithms_enabled()
        set_torch_flags(TrainConfig(deterministic=True))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_resume_under_another_layout_says_only_what_does_not_carry_over() -> None:
    """Elastic resume (docs/resuming.md): the same chunks of batch_size examples spread otherwise continue exactly;
    another batch_size redraws dropout masks and changes a loss over a micro-batch, which is said in one line."""
    from types import SimpleNamespace

    from roformer.train.recipe import dropout_seed, layout_notice

    saved = {"processes": 2, "batch_size": 4, "grad_accum": 1}
    per_example = SimpleNamespace(micro_batch_loss=lambda: None)
    spanning = SimpleNamespace(micro_batch_loss=lambda: "token classification's loss is a mean over tokens")
    assert layout_notice(saved, saved, True, spanning) is None
    assert layout_notice(saved, {**saved, "processes": 1, "grad_accum": 2}, True, spanning) is None  # same chunks
    smaller = {"processes": 2, "batch_size": 2, "grad_accum": 2}
    assert layout_notice(saved, smaller, False, per_example) is None  # nothing drawn or averaged per micro-batch
    notice = layout_notice(saved, smaller, True, spanning)
    assert notice.startswith("resumed under another layout (batch_size 4 -> 2, grad_accum 1 -> 2)")
    assert "dropout masks" in notice and "mean over tokens" in notice and "keep train.batch_size=4" in notice
    old = layout_notice({"processes": 2}, {"processes": 1, "batch_size": 8, "grad_accum": 1}, True, per_example)
    assert "processes 2 -> 1" in old and "the batch_size it was written with" in old  # a checkpoint without layout
    # one micro-batch per step: the chunk is the rank, the seed the one runs had before chunks had their own
    assert [dropout_seed(7, 3, rank) for rank in range(2)] == [(7 << 32) + 3 * 4096 + rank for rank in range(2)]
