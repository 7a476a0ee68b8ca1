"""What only a GPU can exercise (skipped on CPU): mixed precision, fused kernels, compile, sharded launchers.

- bf16 and fp16 pretraining steps have finite, falling losses; fp16 runs through a loss scaler, whose skipped
  steps count towards max_bad_steps;
- the flash SDPA backend accepts a pretraining batch (no mask) in bf16, forward and backward, for every encoding;
- torch's variable-length flash kernel (packed documents, unpadded batches) equals SDPA with the mask;
- a compiled bf16 run matches eager and compiles few graphs; a resumed bf16 run repeats the uninterrupted one;
- FSDP and DeepSpeed pretraining and fine-tuning: every process runs the same number of evaluation forwards (an FSDP
  collective each), fine-tuning gathers its best weights on every process, the DeepSpeed config gets its
  micro-batch and accumulation from `train:`; an FSDP run stopped on every GPU resumes on one (sharded checkpoints
  through torch.distributed.checkpoint, resharded on load).

Run them on a GPU machine with `python -m pytest -m gpu tests/e2e/test_gpu.py` (scripts/gpu/gpu_check.sh does).
"""

from __future__ import annotations

import csv
import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch
from helpers import accelerate_launch, interrupted_run, stop_after, tiny_run_config, train_losses

import roformer
from roformer.cli import main
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import NUMBERS, generate_documents
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FSDP and DeepSpeed launch paths)"),
]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_pretraining_on_the_gpu(precision: str, tmp_path: Path) -> None:
    from roformer.train.pretrain import Pretrainer

    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=30, lr=3e-3, eval_every=15, save_every=0)
    config = load(PretrainConfig, yaml, [f"train.mixed_precision={precision}"])
    trainer = Pretrainer(config, tmp_path / "run")
    assert trainer.engine.accelerator.device.type == "cuda"
    if precision == "fp16":  # loss scaling: a GradScaler steps (and skips overflowing steps itself)
        assert trainer.engine.accelerator.scaler is not None
    trainer.run()
    losses = [loss for _, loss in train_losses(tmp_path / "run")]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    if precision == "fp16":
        assert 0 < trainer.engine.accelerator.scaler.get_scale() < float("inf")


def test_fp16_run_whose_every_step_overflows_stops_as_diverged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused AdamW's skips are read from the loss scale: max_bad_steps applies, no silent final/ without updates."""
    from roformer.errors import Diverged
    from roformer.train import pretrain as pretrain_module

    original = pretrain_module._MaskedStep.loss

    def overflowing(self, model, batch):
        value, share = original(self, model, batch)
        return value * float("inf"), share

    monkeypatch.setattr(pretrain_module._MaskedStep, "loss", overflowing)
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=40, save_every=0, eval_every=0, max_bad_steps=5)
    with pytest.raises(Diverged, match="5 consecutive steps"):
        pretrain(load(PretrainConfig, yaml, ["train.mixed_precision=fp16"]), tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists()


@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal", "learned", "none"])
def test_flash_attention_accepts_a_pretraining_batch(encoding: str) -> None:
    """Full blocks carry no mask, so nothing stops the fused kernel: forcing FLASH must not raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = roformer.ModelConfig(
        vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, position_encoding=encoding
    )
    model = roformer.MaskedLM(config).cuda().train()  # dropout on: flash applies it inside the kernel
    ids = torch.randint(5, 1000, (8, 512), device="cuda")
    labels = torch.where(torch.rand(ids.shape, device="cuda") < 0.15, ids, -100)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, labels=labels, masked_only=True).loss
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal", "none"])
def test_the_variable_length_kernel_equals_the_mask(encoding: str, layout: str) -> None:
    """torch's varlen flash kernel for packed documents (4 per row) and an unpadded batch (40% padding) against SDPA
    over the grid with the block-diagonal or padding mask: bf16 logits and gradients alike, and the kernel taken."""
    import roformer.model.attention as attention

    if not attention.varlen_kernel_available(torch.device("cuda"), torch.bfloat16, 64):
        pytest.skip("torch's variable-length flash kernel does not run on this GPU (Ampere or newer, torch >= 2.9)")
    config = roformer.ModelConfig(
        vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, hidden_dropout=0.0,
        attention_dropout=0.0, position_encoding=encoding,
    )  # fmt: skip
    torch.manual_seed(0)
    model = roformer.MaskedLM(config).cuda().train()
    model.set_unpadding(True)
    ids = torch.randint(5, 1000, (8, 512), device="cuda")
    batch = {"input_ids": ids}
    if layout == "packed":
        batch["document_ids"] = torch.arange(512, device="cuda").div(128, rounding_mode="floor").expand(8, 512)
    else:
        lengths = torch.randint(100, 512, (8,), device="cuda")
        batch["attention_mask"] = (torch.arange(512, device="cuda") < lengths[:, None]).long()
    keep = batch.get("attention_mask", torch.ones_like(ids)).bool()
    results, calls, kernel = [], [], attention.varlen_kernel
    attention.varlen_kernel = lambda *args: calls.append(1) or kernel(*args)
    try:
        for varlen in (True, False):
            model.set_varlen_attention(varlen)
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(**batch).logits[keep].float()
            logits.square().mean().backward()
            results.append(
                (logits.detach(), [p.grad.float().clone() for p in model.parameters() if p.grad is not None])
            )
    finally:
        attention.varlen_kernel = kernel
    assert len(calls) == config.num_layers
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2e-2, atol=2e-2)
    for varlen_grad, mask_grad in zip(results[0][1], results[1][1], strict=True):
        assert (varlen_grad - mask_grad).norm() <= 2e-2 * mask_grad.norm() + 1e-6


@pytest.mark.parametrize("encoding", ["shaw", "shaw-values", "t5_bias", "alibi"])
def test_the_relative_biases_run_on_the_memory_efficient_kernel_without_a_host_sync(encoding: str) -> None:
    """A float bias rules out flash, not the memory-efficient kernel: forced, it equals the math kernel, and a
    forward makes no host sync (the ALiBi slopes once were copied to the GPU in every forward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fields = {"shaw_values": True} if encoding == "shaw-values" else {}
    config = roformer.ModelConfig(
        vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, hidden_dropout=0.0,
        attention_dropout=0.0, position_encoding=encoding.removesuffix("-values"), **fields,
    )  # fmt: skip
    model = roformer.MaskedLM(config).cuda().train()
    ids = torch.randint(5, 1000, (8, 512), device="cuda")
    labels = torch.where(torch.rand(ids.shape, device="cuda") < 0.15, ids, -100)
    losses = []
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend), torch.autocast("cuda", dtype=torch.bfloat16):
            losses.append(model(ids, labels=labels).loss)
    losses[0].backward()
    assert math.isfinite(losses[0].item()) and abs(losses[0].item() - losses[1].item()) < 0.02
    model(ids)  # the slopes and tables are on the GPU now
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            model(ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_compiled_bf16_run_matches_eager(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=20, eval_every=10, save_every=0)
    eager = train_losses(pretrain(load(PretrainConfig, yaml, ["train.mixed_precision=bf16"]), tmp_path / "eager"))
    torch._dynamo.reset()
    counters.clear()
    overrides = ["train.mixed_precision=bf16", "train.compile=true"]
    compiled = train_losses(pretrain(load(PretrainConfig, yaml, overrides), tmp_path / "compiled"))
    # train graph, eval graph, the last short eval chunk; a rotary table moved to the GPU may add one
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])
    for (_, a), (_, b) in zip(eager, compiled, strict=True):
        assert b == pytest.approx(a, rel=2e-2)  # bf16: fused kernels round differently


def test_resumed_bf16_run_repeats_the_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact where the GPU is deterministic: as exact as two uninterrupted runs agree with each other."""
    yaml = tiny_run_config(
        tmp_path / "c.yaml",
        model={"hidden_dropout": 0.1, "attention_dropout": 0.1},
        max_steps=10,
        mixed_precision="bf16",
    )
    config = load(PretrainConfig, yaml)
    first = train_losses(pretrain(config, tmp_path / "first"))
    second = train_losses(pretrain(config, tmp_path / "second"))
    interrupted_run(config, tmp_path / "cut", 6, monkeypatch)
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "cut"), "--resume"]) == 0
    resumed = train_losses(tmp_path / "cut")
    if first == second:
        assert resumed == first
    else:  # non-deterministic kernels (atomics): within the run-to-run spread
        spread = max(abs(a - b) for (_, a), (_, b) in zip(first, second, strict=True))
        assert all(abs(a - b) <= 2 * spread for (_, a), (_, b) in zip(first, resumed, strict=True))


def test_fsdp_pretraining_resumes_on_another_number_of_gpus(tmp_path: Path) -> None:
    """FSDP2 checkpoints are torch.distributed.checkpoint shards (roformer.train.sharded), resharded on load: stopped
    on every visible GPU after step 3 and resumed on one (on a one-GPU machine: on it again, which still runs the
    engine's sharded writer and reader under accelerate's FSDP2 `prepare`), the run logs the uninterrupted run's
    losses to TF32's rounding. docs/resuming.md; the CPU test of the resharding is tests/e2e/test_elastic.py."""
    gpus = torch.cuda.device_count()
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=6, save_every=0, eval_every=3, batch_size=2,
                           mixed_precision="no")  # fmt: skip
    launch("fsdp", "pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "full"))
    stop = stop_after(tmp_path / "stop.py", 3)
    args = ["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "cut")]
    stopped = accelerate_launch([str(stop), *args], "fsdp", "--num_processes", str(gpus))
    assert (tmp_path / "cut" / "checkpoints" / "step-3" / "sharded" / ".metadata").is_file(), stopped.stderr[-4000:]
    resumed = accelerate_launch(
        ["-m", "roformer", *args, "--resume", "--set", f"train.grad_accum={gpus}"], "fsdp", "--num_processes", "1"
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    reference, ours = train_losses(tmp_path / "full"), train_losses(tmp_path / "cut")
    assert [s for s, _ in ours] == [s for s, _ in reference]
    assert all(abs(a - b) < 1e-2 for (_, a), (_, b) in zip(ours, reference, strict=True)), (ours, reference)


def launch(launcher: str, *args: str) -> None:
    """`accelerate launch` with one of configs/accelerate/*.yaml on every visible GPU; fails with its stderr.

    The failure shows the first traceback (where it broke: a long error message repeated per parameter pushes it
    out of any tail) and the end of the output.
    """
    processes = str(torch.cuda.device_count())
    done = accelerate_launch(["-m", "roformer", *args], launcher, "--num_processes", processes)
    first = done.stderr.find("Traceback")
    assert done.returncode == 0, done.stderr[max(first, 0) :][:3000] + "\n...\n" + done.stderr[-1500:]


def sst2_files(folder: Path) -> dict[str, Path]:
    """A small binary task with an odd number of dev examples (uneven shards over processes)."""
    sentences = [s.strip() for d in generate_documents(600, seed=9) for s in d.split(" . ") if s.strip()]
    rows = [(s, int(bool(set(NUMBERS) & set(s.split())))) for s in sentences[:301]]
    random.Random(0).shuffle(rows)
    paths = {}
    for split, part in {"train": rows[:240], "dev": rows[240:]}.items():
        paths[split] = folder / f"{split}.csv"
        with paths[split].open("w", newline="") as f:
            csv.writer(f).writerows([("sentence", "label"), *part])
    return paths


@pytest.mark.parametrize("launcher", ["fsdp", "deepspeed-zero2"])
def test_pretrain_and_finetune_under_sharded_launchers(launcher: str, tmp_path: Path) -> None:
    if launcher.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    yaml = tiny_run_config(tmp_path / "c.yaml", data={"max_eval_blocks": 7}, max_steps=6, eval_every=3, save_every=3)
    launch(launcher, "pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "run"))
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    files = sst2_files(tmp_path)
    glue = {
        "init": str(tmp_path / "run" / "final"),
        "data": {
            "task": "sst2",
            "source": "files",
            "train_file": str(files["train"]),
            "validation_file": str(files["dev"]),
            "max_length": 32,
        },
        "train": {"max_steps": 6, "batch_size": 8, "lr": 1e-3, "eval_every": 3, "progress": False},
    }
    write_yaml(tmp_path / "glue.yaml", glue)
    launch(launcher, "finetune", "--config", str(tmp_path / "glue.yaml"), "--output-dir", str(tmp_path / "glue"))
    assert (tmp_path / "glue" / "best" / "model.safetensors").is_file()
