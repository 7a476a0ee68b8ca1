"""How should the sinusoidal baseline be scaled? MLM on real English text, equal everything but the positions.

Arms (same data, tokenizer, batch order, initial weights where shared, schedule and seed):
    raw          table added as is (entries in [-1, 1]): the unfair baseline
    inv-sqrt-d   table * 1/sqrt(d): with the LayerNorm that follows the embedding sum, this is exactly Vaswani's
                 "multiply the token embeddings by sqrt(d)" (LN(sqrt(d) e + p) = LN(e + p / sqrt(d)))
    init-matched table * initializer_range * sqrt(2): RMS equal to the token embedding init (our default)
    learned      Cramming-style learned scalar, initialised at init-matched
    learned-pos  BERT's learned table (reference)
    rotary       RoFormer (reference)
    none         no positions at all (what a collapsed learned scale amounts to)

    python scripts/studies/sinusoidal_scale_sweep.py --corpus ../shared/data/corpus/gutenberg --steps 400

Prints a table of eval MLM loss (fixed mask) at a few steps; `--json` writes it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

import roformer
from roformer.data.masking import mask_tokens

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def read_corpus(folder: Path) -> list[str]:
    texts = []
    for path in sorted(folder.glob("*.txt")):
        raw = path.read_bytes()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(raw.decode("latin-1"))  # shakespeare-caesar.txt is Latin-1
    return texts


def build_blocks(texts: list[str], vocab_size: int, length: int) -> tuple[torch.Tensor, Tokenizer]:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    ids = [i for enc in tok.encode_batch(lines) for i in enc.ids + [SPECIALS.index("[SEP]")]]
    body = length - 2
    n = len(ids) // body
    blocks = torch.tensor(ids[: n * body]).view(n, body)
    cls = torch.full((n, 1), SPECIALS.index("[CLS]"))
    sep = torch.full((n, 1), SPECIALS.index("[SEP]"))
    return torch.cat([cls, blocks, sep], dim=1), tok


ARMS = {
    "raw": dict(position_encoding="sinusoidal", sinusoidal_scale=1.0),
    "inv-sqrt-d": dict(position_encoding="sinusoidal", sinusoidal_scale="inv_sqrt_d"),
    "init-matched": dict(position_encoding="sinusoidal"),
    "learned-scale": dict(position_encoding="sinusoidal", sinusoidal_scale_learned=True),
    "learned-pos": dict(position_encoding="learned"),
    "rotary": dict(position_encoding="rotary"),
    "none": dict(position_encoding="none"),
}


def make_model(arm: str, args: argparse.Namespace) -> roformer.MaskedLM:
    fields = dict(ARMS[arm])
    if fields.get("sinusoidal_scale") == "inv_sqrt_d":
        fields["sinusoidal_scale"] = 1.0 / math.sqrt(args.hidden)
    config = roformer.ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.length,
        **fields,
    )
    torch.manual_seed(args.seed)  # same initial weights for every parameter the arms share
    return roformer.MaskedLM(config)


def evaluate(model: roformer.MaskedLM, eval_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in eval_batches:
            out = model(ids, labels=labels, masked_only=True)
            n = int((labels != -100).sum())
            total += float(out.loss) * n
            count += n
    model.train()
    return total / count


def run_arm(arm: str, args: argparse.Namespace, train: torch.Tensor, eval_batches: list) -> dict[int, float]:
    model = make_model(arm, args).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    warmup = args.steps // 10
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (args.steps - s) / (args.steps - warmup)))
    )
    order = torch.Generator().manual_seed(args.seed)
    mask_gen = torch.Generator().manual_seed(args.seed + 1)
    specials = list(range(len(SPECIALS)))
    curve = {}
    start = time.time()
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(train), (args.batch,), generator=order)
        ids, labels = mask_tokens(train[idx], 4, args.vocab, specials, generator=mask_gen)
        loss = model(ids, labels=labels, masked_only=True).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == args.steps:
            curve[step] = evaluate(model, eval_batches)
            scale = model.backbone.embeddings.sinusoidal
            extra = f" scale={float(torch.as_tensor(scale.scale).detach()):.4f}" if scale is not None else ""
            print(
                f"{arm:>13} step {step:4d} eval_loss {curve[step]:.3f} ({time.time() - start:.0f}s){extra}", flush=True
            )
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/corpus/gutenberg")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-blocks", type=int, default=256)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    blocks, _ = build_blocks(read_corpus(args.corpus), args.vocab, args.length)
    g = torch.Generator().manual_seed(1234)
    blocks = blocks[torch.randperm(len(blocks), generator=g)]
    held_out, train = blocks[: args.eval_blocks], blocks[args.eval_blocks :]
    eval_gen = torch.Generator().manual_seed(4321)  # one fixed eval mask for every arm and step
    eval_batches = [
        mask_tokens(held_out[i : i + 32], 4, args.vocab, list(range(len(SPECIALS))), generator=eval_gen)
        for i in range(0, len(held_out), 32)
    ]
    print(f"{len(train)} train blocks of {args.length} tokens, {len(held_out)} eval blocks")
    results = {arm: run_arm(arm, args, train, eval_batches) for arm in args.arms.split(",")}
    steps = sorted(next(iter(results.values())))
    print("\n| arm | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for arm, curve in results.items():
        print(f"| {arm} | " + " | ".join(f"{curve[s]:.3f}" for s in steps) + " |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}))


if __name__ == "__main__":
    main()
