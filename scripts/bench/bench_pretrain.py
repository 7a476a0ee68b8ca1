"""Pretraining throughput: our `roformer pretrain` step vs HF RoFormerForMaskedLM + DataCollatorForLanguageModeling.

Both sides train the same model (HF's is converted from ours with `to_hf`, same weights) on the same packed blocks
of a pretraining config, in one process, interleaved in chunks of steps (ours, HF, ours, ...), and we report the
median tokens/s over chunks. A step includes everything a training loop pays for:

- ours: `Engine.train_step` on the pretraining task, i.e. the step's masked batch (MLMBatches), forward with the
  decoder only at the masked positions, backward through accelerate, grad clipping, AdamW, LR schedule;
- HF: `DataCollatorForLanguageModeling` on the step's blocks (80/10/10 masking), `RoFormerForMaskedLM` forward
  with labels (full-vocabulary logits), backward, grad clipping, AdamW, LR schedule.

Also reported: the share of our step spent preparing data (must stay under 5%), and each side's model FLOPs
utilisation (roformer.model.flops: ours credited with the masked decoder rows it computes, HF with every row)
against a GEMM measured in the same dtype on the same device.

    python scripts/bench/bench_pretrain.py                                  # tiny and small configs on this machine
    python scripts/bench/bench_pretrain.py --configs configs/pretrain/roformer-small.yaml --steps 10 --repeats 5
    python scripts/bench/bench_pretrain.py --device cuda --dtype bf16 --compile \
        --configs configs/pretrain/roformer-base.yaml --set data.source=text --set data.paths=[corpus.txt]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import roformer
from roformer.config import load
from roformer.data.masking import masked_positions
from roformer.model.flops import measure_matmul_tflops, spec_tflops, synchronize, training_flops_per_token
from roformer.train.config import PretrainConfig
from roformer.train.optim import param_groups
from roformer.train.pretrain import Pretrainer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIGS = [REPO / "configs/pretrain/roformer-tiny.yaml", REPO / "configs/pretrain/roformer-small.yaml"]


class HFLoop:
    """HF's standard MLM recipe on the same blocks: collator + RoFormerForMaskedLM + AdamW + linear schedule."""

    def __init__(self, trainer: Pretrainer, dtype: torch.dtype, compile: bool) -> None:
        from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

        ours = trainer.engine.bare_model()
        self.device = trainer.engine.accelerator.device
        self.model = roformer.to_hf(ours).to(self.device).train()
        self.forward = torch.compile(self.model) if compile else self.model
        self.dtype = dtype
        train = trainer.config.train
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, train.weight_decay),
            lr=train.lr,
            betas=(train.adam_beta1, train.adam_beta2),
            eps=train.adam_eps,
            **({"fused": True} if self.device.type == "cuda" else {}),  # as our engine on CUDA
        )
        warmup = train.warmup_for(train.max_steps)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup, train.max_steps)
        self.collator = DataCollatorForLanguageModeling(
            trainer.data.tokenizer, mlm_probability=trainer.config.data.mask_rate, return_tensors="pt"
        )
        self.batches = trainer.batches
        self.max_grad_norm = train.max_grad_norm or float("inf")
        self.data_sec = 0.0

    def step(self, step: int) -> None:
        t0 = time.perf_counter()
        blocks = self.batches.of(step).source.blocks_of(step)
        batch = self.collator([{"input_ids": row} for row in blocks])
        ids, labels = (batch[k].to(self.device, non_blocking=True) for k in ("input_ids", "labels"))
        self.data_sec += time.perf_counter() - t0
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.forward(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def bench_config(path: Path, args: argparse.Namespace, peak: float) -> dict[str, float]:
    overrides = [f"train.batch_size={args.batch_size}"] if args.batch_size else []
    overrides += [f"train.mixed_precision={PRECISION[args.dtype]}", f"train.compile={str(args.compile).lower()}"]
    config = load(PretrainConfig, path, overrides + ["train.progress=false", "train.report_to=[]"] + args.set)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Pretrainer(config, Path(tmp) / "run")
        trainer.prepare_run_dir()
        trainer.build_model()
        device = trainer.engine.accelerator.device
        hf = HFLoop(trainer, DTYPES[args.dtype], args.compile)
        tokens = trainer.batches.global_batch * trainer.data.train.shape[1]
        ours_rates, hf_rates, data_fractions, rows = [], [], [], []
        step = 0
        for _ in range(args.warmup):  # first steps allocate (and compile); not timed
            trainer.engine.train_step(trainer, step)
            hf.step(step)
            step += 1
        for _ in range(args.repeats):
            data_sec = 0.0
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                data_sec += trainer.engine.train_step(trainer, step).data_sec
                step += 1
            synchronize(device)
            ours_sec = time.perf_counter() - t0
            for labels in (trainer.batches.step(s)[1] for s in range(step - args.steps, step)):
                rows.append(len(masked_positions(labels)) / labels.numel())  # decoder rows our model computed
            ours_rates.append(tokens * args.steps / ours_sec)
            data_fractions.append(data_sec / ours_sec)
            t0 = time.perf_counter()
            for i in range(args.steps):
                hf.step(step - args.steps + i)  # the same blocks as ours
            synchronize(device)
            hf_rates.append(tokens * args.steps / (time.perf_counter() - t0))
    ours, theirs = statistics.median(ours_rates), statistics.median(hf_rates)
    length = config.data.max_seq_len
    ours_flops = training_flops_per_token(config.model, length, statistics.mean(rows))
    hf_flops = training_flops_per_token(config.model, length, 1.0)
    return {
        "config": path.name,
        "shape": f"{config.model.num_layers}x{config.model.hidden_size}, batch {trainer.batches.global_batch}"
        f"x{length}, vocab {config.model.vocab_size}",
        "ours": ours,
        "hf": theirs,
        "ratio": ours / theirs,
        "data_fraction": statistics.median(data_fractions),
        "ours_mfu": ours * ours_flops / 1e12 / peak,
        "hf_mfu": theirs * hf_flops / 1e12 / peak,
    }


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION = {"fp32": "'no'", "bf16": "bf16", "fp16": "fp16"}  # quoted: YAML reads a bare no as false


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", type=Path, default=DEFAULT_CONFIGS)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=5, help="chunks per side (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, help="override train.batch_size")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: what accelerate picks (CUDA if present)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="train.mixed_precision of both sides")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models (timed after compiling)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before CUDA is initialised: accelerate then picks the CPU
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak = measure_matmul_tflops(device, DTYPES[args.dtype])
    spec = spec_tflops(device, DTYPES[args.dtype])
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"torch {torch.__version__}, {name}, {torch.get_num_threads()} threads, {args.dtype}"
        f"{', compiled' if args.compile else ''}; measured GEMM peak {peak:.3g} TFLOPS"
        + (f" (spec sheet {spec:.0f} dense)" if spec else "")
    )
    print("| config | shape | ours tokens/s | HF tokens/s | ours / HF | ours MFU | HF MFU | data share of our step |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.configs:
        r = bench_config(path, args, peak)
        print(
            f"| {r['config']} | {r['shape']} | {r['ours']:,.0f} | {r['hf']:,.0f} | {r['ratio']:.2f}x "
            f"| {100 * r['ours_mfu']:.1f}% | {100 * r['hf_mfu']:.1f}% | {100 * r['data_fraction']:.1f}% |"
        )


if __name__ == "__main__":
    main()
