"""MQAR in Zoology's regime: which of the model and the way a query is asked keeps an encoder at the floor.

The rows are `configs/synthetic/mqar-zoology.yaml`'s (4,096 keys, 4,096 values, one constant filler, power-law query
places, 100,000 rows of 64 tokens), trained with the recipe's AdamW (weight decay 0.1 on matrices and embeddings,
2% linear warmup, linear decay, gradients clipped at 1), and dev accuracy read at the asked positions. Two things
vary, one at a time:

- the model: `ours` (the config's MaskedLM: post-LN, BERT's embedding norm and MLM head; `--model-set` changes its
  fields, e.g. `attention_pattern=causal`, `norm_position=pre`) or `reference`, a Zoology-like language model
  written out here (tied embeddings, no embedding norm, pre-LN attention-only blocks with one rotary head, a final
  norm; Arora et al. 2023's `TransformerBlock` with an identity state mixer);
- the question: `--ask mask` (the generator's: the value is predicted at a [MASK] after the query key) or `--ask key`
  (Zoology's next-token framing: the value is predicted at the query key's own position); `--causal` (the reference
  model; for ours `--model-set attention_pattern=causal`).

    python scripts/studies/mqar_framing.py --model reference --causal --ask key --out runs/mqar-framing/ref-key.jsonl

One thread: about 0.7 s an update at batch 512. Each evaluation is a line of JSON (step, train and dev loss, dev
accuracy) on stdout and in `--out`. docs/length-generalization.md ("mqar in Zoology's regime") has what it found.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from roformer.config import load
from roformer.labels import IGNORE_INDEX
from roformer.model.config import ModelConfig
from roformer.model.heads import MaskedLM
from roformer.tasks.build import make_task
from roformer.train.config import FinetuneConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "synthetic" / "mqar-zoology.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["ours", "reference"], default="ours")
    parser.add_argument("--ask", choices=["mask", "key"], default="mask", help="where the value is predicted")
    parser.add_argument("--causal", action="store_true", help="causal attention in the reference model")
    parser.add_argument("--steps", type=int, default=750)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2.15e-3)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="a config override (data.synthetic.pairs=8)")
    parser.add_argument("--model-set", action="append", default=[], help="a ModelConfig field of ours (k=v)")
    parser.add_argument("--out", help="append the evaluations here as JSON lines")
    return parser.parse_args()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on interleaved pairs (the paper's eq. 34): x (B, T, D), cos and sin (T, D/2)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class ReferenceBlock(nn.Module):
    """x = x + Attn(LN(x)), one head of the full width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)  # (B, T, C) each
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask)[:, 0]  # (B, T, C)
        return x + self.out(y)


class ReferenceLM(nn.Module):
    """A Zoology-like attention-only language model: embeddings, pre-LN blocks, a final norm, tied output."""

    def __init__(self, vocab: int, width: int, layers: int, causal: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(ReferenceBlock(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.causal = causal
        for module in self.modules():  # normal(0, 0.02), as Zoology's `_init_weights`
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor, **_: Any) -> tuple[Tensor, Tensor]:
        """(logits at the labelled positions (N, V), their mean cross-entropy)."""
        T, width = input_ids.shape[1], self.embed.embedding_dim
        angles = torch.arange(T).float()[:, None] * 10000 ** (-torch.arange(0, width, 2).float() / width)
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T)
        if self.causal:
            mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, mask, angles.cos(), angles.sin())
        asked = labels != IGNORE_INDEX
        logits = self.norm(x[asked]) @ self.embed.weight.T  # (N, V)
        return logits, F.cross_entropy(logits, labels[asked])


def asked_at_the_key(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The labels one position earlier: each value asked at its query key, the [MASK] after it never read."""
    labels = batch["labels"]
    shifted = torch.cat((labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)), dim=1)
    return {**batch, "labels": shifted}


def build_model(args: argparse.Namespace, config: FinetuneConfig, vocab: int, pad: int) -> nn.Module:
    """`ours` (the config's MaskedLM with `--model-set`) or the reference model of the same width and depth."""
    fields = {**config.model, "vocab_size": vocab, "pad_token_id": pad}
    if args.model == "reference":
        return ReferenceLM(vocab, fields["hidden_size"], fields["num_layers"], args.causal)
    fields.update({k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.model_set)})
    return MaskedLM(ModelConfig(**fields))


def loss_and_logits(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(logits at the asked positions (N, V), the loss) of either model."""
    if isinstance(model, ReferenceLM):
        return model(**batch)
    out = model(**batch, masked_only=True)
    return out.logits, out.loss


def optimizer_of(model: nn.Module, args: argparse.Namespace) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (weight decay 0.1 on matrices and embeddings), 2% linear warmup, then linear decay to 0."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}], lr=args.lr
    )
    warmup = max(1, math.ceil(0.02 * args.steps))
    decay = max(1, args.steps - warmup)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (args.steps - s) / decay))
    )
    return optimizer, schedule


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    config = load(FinetuneConfig, CONFIG, args.set)
    task = make_task(config.data)
    tokenizer = task.tokenizer()
    splits = task.encode(tokenizer, config.data.max_length)
    vocab, pad = len(tokenizer.get_vocab()), tokenizer.pad_token_id
    model = build_model(args, config, vocab, pad)
    optimizer, schedule = optimizer_of(model, args)
    train, dev = splits["train"], splits["dev"]

    def batch_of(split: Any, rows: list[int]) -> dict[str, Tensor]:
        batch = task.collate(split, rows, pad, 10**9)
        return asked_at_the_key(batch) if args.ask == "key" else batch

    dev_batch = batch_of(dev, list(range(len(dev.ids))))
    generator = torch.Generator().manual_seed(args.seed)
    order, at, start = torch.randperm(len(train.ids), generator=generator).tolist(), 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        if at + args.batch > len(order):  # a new epoch, reshuffled
            order, at = torch.randperm(len(train.ids), generator=generator).tolist(), 0
        model.train()
        _, loss = loss_and_logits(model, batch_of(train, order[at : at + args.batch]))
        at += args.batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                logits, dev_loss = loss_and_logits(model, dev_batch)
            gold = dev_batch["labels"][dev_batch["labels"] != IGNORE_INDEX]
            line = {
                "step": step,
                "loss": round(loss.item(), 4),
                "dev_loss": round(dev_loss.item(), 4),
                "dev_accuracy": round((logits.argmax(-1) == gold).float().mean().item(), 4),
                "seconds_per_update": round((time.perf_counter() - start) / step, 3),
                "model": args.model,
                "ask": args.ask,
                "causal": args.causal or "attention_pattern=causal" in args.model_set,
                "model_set": args.model_set,
            }
            print(json.dumps(line), flush=True)
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
