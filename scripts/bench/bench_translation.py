"""Translation speed: our encoder-decoder against HF `EncoderDecoderModel` of RoFormer halves, the same weights.

Two measurements, each side in this one process, interleaved batch by batch so that a busy machine slows both alike:

- a training step (forward, label-smoothed loss, backward, AdamW): real source + target tokens per second, on the
  recipe's own batches (Multi30k pairs in token batches of `data.translation.max_tokens`, as `roformer finetune`
  makes them). Ours computes the real tokens alone (`train.unpadding`, the default); HF's model is `to_hf` of ours
  and gets the same batches, decoder inputs (the labels shifted right behind the start token) and loss. Then the
  same with each library's own batches (a pipeline, not a step): HF's on batches as Seq2SeqTrainer makes them by
  default (random pairs, as many a batch as ours hold on average, padded to the longest by DataCollatorForSeq2Seq).
  Each side's matrix-product FLOPs are counted (torch's `FlopCounterMode`, an untimed pass) and given as a share of
  this CPU's fp32 GEMM peak measured in the same process (`measure_matmul_tflops`, the median of three
  measurements before, between and after the steps): how far either side is from
  what the hardware delivers, which bounds the ratio a faster step could reach.
- beam-4 decoding of the test set (length penalty 0.6, early stopping, the same token limit; HF has no max_len_a):
  sentences per second of `EncoderDecoder.generate` (what `roformer translate` runs) and of HF `generate` on the
  converted model, in the same batches in order of source length; the tokens each side produced are compared, and
  the matrix-product FLOPs each search executes are counted in an untimed pass.

The model is a trained one (`--model RUN/best`, its tokenizer) or, without it, the config's model with fresh weights
(its joint BPE trained here): then few targets end before the limit, which is the search's worst case.

    python scripts/bench/bench_translation.py --model runs/translation/multi30k-cpu/best \
        --out runs/bench/translation.json
    python scripts/bench/bench_translation.py --steps 2 --rounds 1 --sentences 64        # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from roformer.config import load
from roformer.labels import IGNORE_INDEX
from roformer.model.flops import measure_matmul_tflops
from roformer.model.hf import to_hf
from roformer.model.model import ARCHITECTURES
from roformer.model.pretrained import load_pretrained
from roformer.model.seq2seq import shifted_right
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import task_inputs

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "translation" / "multi30k-cpu.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG), help="the translation config (its data, batches, model)")
    parser.add_argument("--model", help="a trained encoder-decoder directory (default: the config's model, fresh)")
    parser.add_argument("--steps", type=int, default=8, help="training batches timed per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the training batches (median reported)")
    parser.add_argument("--sentences", type=int, default=1000, help="test sentences decoded")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the token limit of both searches")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    parser.add_argument("--decode-rounds", type=int, default=2, help="passes over the test set (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    return parser.parse_args()


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any], int]:
    """(our model, HF's converted model, the task, its encoded splits, the max length)."""
    overrides = [f"data.max_eval_examples={args.sentences}"]
    if args.model:
        overrides.append(f"init={args.model}")
    config = load(FinetuneConfig, args.config, overrides if not args.model else overrides + ["model={}"])
    task, tokenizer, model_config = task_inputs(config)
    facts = task.check_model(model_config)  # the model's eos, which ends every target
    max_length = config.data.max_length
    encoded = task.encode(tokenizer, max_length, facts)
    torch.manual_seed(args.seed)
    if args.model:
        ours = load_pretrained(args.model, "encoder_decoder")
    else:
        ours = ARCHITECTURES["encoder_decoder"](model_config)
    hf = to_hf(ours)
    return ours, hf, task, encoded, max_length


def check_same_logits(ours: Any, hf: Any, batch: dict[str, torch.Tensor]) -> float:
    """The largest logit difference of the two models on a batch, in eval mode (they hold the same weights)."""
    ours.eval()
    hf.eval()
    with torch.no_grad():
        mine = ours(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels", "decoder_attention_mask")}).logits
        theirs = hf(**hf_inputs(ours, batch)).logits
    real = batch["labels"] != IGNORE_INDEX
    return float((mine[real] - theirs[real]).abs().max())


def hf_inputs(ours: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's inputs of one of our batches: the same decoder inputs (labels shifted right behind the start token)."""
    start, pad = ours.config.decoder_start_token_id, ours.config.decoder.pad_token_id
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "decoder_input_ids": shifted_right(batch["labels"], start, pad),
        "decoder_attention_mask": batch["decoder_attention_mask"],
    }


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Source and target tokens of a batch, padding excluded."""
    return int(batch["attention_mask"].sum() + (batch["labels"] != IGNORE_INDEX).sum())


def train_steps(ours: Any, hf: Any, batches: dict[str, list[dict]], rounds: int, smoothing: float) -> dict[str, Any]:
    """Real tokens/s of a training step on each side over its batches (interleaved per batch), median over rounds."""
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in (("ours", ours), ("hf", hf))}

    def ours_step(batch: dict[str, torch.Tensor]) -> None:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels", "decoder_attention_mask")}
        ours(**inputs, label_smoothing=smoothing).loss.backward()

    def hf_step(batch: dict[str, torch.Tensor]) -> None:
        logits = hf(**hf_inputs(ours, batch)).logits
        labels = batch["labels"]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX,
            label_smoothing=smoothing,
        )  # fmt: skip
        loss.backward()

    steps = {"ours": ours_step, "hf": hf_step}
    ours.train()
    hf.train()
    ours.set_unpadding(True)  # as `roformer finetune` trains (train.unpadding's default)
    tokens = {name: sum(real_tokens(b) for b in side) for name, side in batches.items()}
    seconds: dict[str, list[float]] = {"ours": [], "hf": []}
    for name, step in steps.items():  # warm-up (allocator, lazy init), not timed
        step(batches[name][0])
        optimizers[name].zero_grad(set_to_none=True)
    for _ in range(rounds):
        spent = {"ours": 0.0, "hf": 0.0}
        for pair in zip(batches["ours"], batches["hf"], strict=True):
            for (name, step), batch in zip(steps.items(), pair, strict=True):
                t0 = time.perf_counter()
                step(batch)
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=True)
                spent[name] += time.perf_counter() - t0
        for name, value in spent.items():
            seconds[name].append(value)
    speed = {name: tokens[name] / statistics.median(values) for name, values in seconds.items()}
    padded = {name: 1 - tokens[name] / sum(padded_positions(b) for b in side) for name, side in batches.items()}
    flops = {name: counted_flops(step, batches[name], (ours, hf)) for name, step in steps.items()}
    achieved = {name: flops[name] / statistics.median(values) / 1e12 for name, values in seconds.items()}
    return {
        "tokens": tokens,
        "batches": len(batches["ours"]),
        "padding_fraction": padded,
        "tokens_per_sec": speed,
        "ratio": speed["ours"] / speed["hf"],
        "counted_tflop": {name: value / 1e12 for name, value in flops.items()},
        "achieved_tflops": achieved,
    }


def counted_flops(step: Any, batches: list[dict], models: tuple[Any, ...]) -> float:
    """The matrix-product FLOPs (forward, and backward if any) a side's step executes over `batches`, as torch counts.

    `FlopCounterMode` counts the products (linear layers, batched products, SDPA) of what the step runs, padding
    included where the side computes it; element-wise work is not counted, which is what a share of the GEMM peak
    asks. The counting pass is not timed, and its gradients are dropped.
    """
    total = 0
    for batch in batches:
        with FlopCounterMode(display=False) as counter:
            step(batch)
        total += counter.get_total_flops()
        for model in models:
            model.zero_grad(set_to_none=True)
    return float(total)


def padded_positions(batch: dict[str, torch.Tensor]) -> int:
    """Source and target positions a batch computes, padding included."""
    return batch["attention_mask"].numel() + batch["labels"].numel()


def sentence_batches(task: Any, split: Any, pad_id: int, count: int, size: int, seed: int) -> list[dict]:
    """`count` batches of `size` random pairs padded to their longest (HF's Seq2SeqTrainer: a random sampler and
    DataCollatorForSeq2Seq, no length grouping by default)."""
    generator = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(len(split.source_ids), generator=generator).tolist()
    multiple, task.multiple = task.multiple, 1  # the collator pads to the longest, not to a multiple of 8
    try:
        return [task.collate(split, order[i * size : (i + 1) * size], pad_id, 10_000) for i in range(count)]
    finally:
        task.multiple = multiple


@torch.no_grad()
def decode(ours: Any, hf: Any, split: Any, args: argparse.Namespace, pad_id: int) -> dict[str, Any]:
    """Sentences/s of beam search on each side over `split` (interleaved per batch); how many rows agree."""
    from roformer.tasks.translator import length_order, pad_sources

    ours.eval()
    hf.eval()
    ours.set_unpadding(True)  # as `roformer translate` decodes
    config = ours.config
    order = length_order(split.lengths)
    search = dict(num_beams=args.beam, length_penalty=args.length_penalty, early_stopping=True)
    batches = [
        pad_sources([split.source_ids[r] for r in order[start : start + args.batch_size]], pad_id, 8, 10_000)
        for start in range(0, len(order), args.batch_size)
    ]
    sides = {
        "ours": lambda batch: ours.generate(
            batch["input_ids"], batch["attention_mask"], max_new_tokens=args.max_new_tokens, **search
        ),
        "hf": lambda batch: hf.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=args.max_new_tokens,
            decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
            pad_token_id=config.decoder.pad_token_id, do_sample=False, **search,
        ),
    }  # fmt: skip
    for generate in sides.values():  # warm-up, not timed
        generate(batches[0])
    seconds: dict[str, list[float]] = {"ours": [], "hf": []}
    for _ in range(args.decode_rounds):
        spent, outputs = {"ours": 0.0, "hf": 0.0}, {"ours": [], "hf": []}
        for batch in batches:
            for name, generate in sides.items():
                t0 = time.perf_counter()
                outputs[name] += generate(batch).tolist()
                spent[name] += time.perf_counter() - t0
        for name, value in spent.items():
            seconds[name].append(value)
    same, generated = 0, {"ours": 0, "hf": 0}
    for a, b in zip(outputs["ours"], outputs["hf"], strict=True):
        a, b = target(a, config.eos_token_id), target(b, config.eos_token_id)
        same += a == b
        generated["ours"] += len(a) - 1
        generated["hf"] += len(b) - 1
    speed = {name: len(order) / statistics.median(values) for name, values in seconds.items()}
    # what each search computes in matrix products (an untimed pass): ours leaves out sources whose result is
    # decided and runs the first step once per source, HF computes every beam until the batch's last one ends
    counted = {name: counted_flops(generate, batches, ()) / 1e12 for name, generate in sides.items()}
    return {
        "sentences": len(order),
        "sentences_per_sec": speed,
        "ratio": speed["ours"] / speed["hf"],
        "same_tokens": same / len(order),
        "generated_tokens": generated,
        "counted_tflop": counted,
    }


def target(row: list[int], eos: int) -> list[int]:
    """A generated row up to its end (eos included): after it, ours pads and HF's beam search repeats eos."""
    return row[: row.index(eos, 1) + 1] if eos in row[1:] else row


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    ours, hf, task, encoded, max_length = build(args)
    train = encoded["train"]
    generator = torch.Generator().manual_seed(args.seed)
    batches_of_rows = task.token_batches(train, max_length)
    picked = torch.randperm(len(batches_of_rows), generator=generator)[: args.steps].tolist()
    pad_id = task.encoded_with.pad_token_id
    batches = [task.collate(train, batches_of_rows[i], pad_id, max_length) for i in picked]
    difference = check_same_logits(ours, hf, batches[0])
    decoding = decode(ours, hf, encoded["test"], args, pad_id)  # first: the training steps below change the weights
    smoothing = task.settings.label_smoothing
    peaks = [measure_matmul_tflops("cpu", torch.float32)]  # this CPU's fp32 GEMM peak on these threads, measured
    training = train_steps(ours, hf, {"ours": batches, "hf": batches}, args.rounds, smoothing)
    peaks.append(measure_matmul_tflops("cpu", torch.float32))  # before, between and after: a busy machine varies
    # what each library's own batching gives (a pipeline, not a step): ours by tokens in length order, HF's
    # Seq2SeqTrainer defaults (random pairs padded to the longest) of as many pairs a batch on average
    size = round(sum(len(batches_of_rows[i]) for i in picked) / len(picked))
    theirs = sentence_batches(task, train, pad_id, len(picked), size, args.seed)
    pipeline = train_steps(ours, hf, {"ours": batches, "hf": theirs}, args.rounds, smoothing)
    peaks.append(measure_matmul_tflops("cpu", torch.float32))
    peak = statistics.median(peaks)
    for measured in (training, pipeline):
        measured["gemm_peak_share"] = {name: value / peak for name, value in measured["achieved_tflops"].items()}
    shape = ours.config.encoder
    results = {
        "model": args.model or f"{args.config} (fresh weights)",
        "shape": f"{shape.num_layers}+{ours.config.decoder.num_layers} layers, width {shape.hidden_size}, "
        f"{shape.num_heads} heads, FFN {shape.intermediate_size}, vocabulary {shape.vocab_size}",
        "parameters": ours.num_parameters(),
        "threads": args.threads,
        "torch": torch.__version__,
        "max_logit_difference": difference,
        "gemm_peak_tflops": peak,
        "gemm_peak_tflops_measured": peaks,
        "training": training,
        "training_own_batches": {**pipeline, "hf_batch_size": size},
        "decoding": {
            **decoding,
            "beam": args.beam,
            "length_penalty": args.length_penalty,
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
        },  # fmt: skip
    }
    print(json.dumps(results, indent=2))
    speed, sentences = training["tokens_per_sec"], decoding["sentences_per_sec"]
    print(
        f"training step: ours {speed['ours']:,.0f} tokens/s, HF {speed['hf']:,.0f} ({training['ratio']:.2f}x; each "
        f"library's own batches: {pipeline['ratio']:.2f}x); share of the {peak:.3f} TFLOPS GEMM peak: ours "
        f"{training['gemm_peak_share']['ours']:.0%}, HF {training['gemm_peak_share']['hf']:.0%}; "
        f"beam-{args.beam} decoding: ours {sentences['ours']:.1f} sentences/s, HF {sentences['hf']:.1f} "
        f"({decoding['ratio']:.2f}x), the same tokens in {decoding['same_tokens']:.1%} of sentences, computing "
        f"{decoding['counted_tflop']['ours'] / decoding['counted_tflop']['hf']:.0%} of HF's matrix-product FLOPs"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
