"""The paper's long-term decay (RoFormer sec. 3.4.3, fig. 2): the bound, and the decay measured in a trained model.

The bound. Split a head's q and k into d/2 pairs, h_j = q_[2j:2j+1] k*_[2j:2j+1] (as complex numbers), and let
S_j = sum_{k<j} e^{i r theta_k} with r = m - n and theta_k = base^(-2k/d). The rotated score is
Re[sum_j h_j e^{i r theta_j}], and Abel summation (h_{d/2} = 0, S_0 = 0) gives

    |sum_j h_j e^{i r theta_j}| = |sum_j S_{j+1} (h_{j+1} - h_j)| <= (max_j |h_{j+1} - h_j|) sum_{j=1}^{d/2} |S_j|

(paper sec. 3.4.3). The second factor depends on the distance alone; the paper plots it averaged over the pairs,
(1/(d/2)) sum_{j=1}^{d/2} |S_j|, as the "relative upper bound" against the relative distance (fig. 2, distances 0 to
about 256): `relative_upper_bound`. At r = 0 every |S_j| = j, so it starts at its maximum (d/2 + 1) / 2.

The head size of fig. 2 is not stated in the paper, nor in any source we could check. We draw it at d = 128
(`FIGURE_HEAD_SIZE`), an assumption stated where the figure is (docs/length-generalization.md): at d = 128 the curve
has the figure's shape (its maximum at 0, an oscillating fall to about a fifth of it by 256), a shape d barely changes
(the value at 256 is 0.23, 0.20 and 0.20 of the value at 0 for d = 64, 128, 256) while it sets the scale,
(d/2 + 1) / 2 at 0. Any other d is an argument away.

The measured decay (`roformer attention-distance`). The bound says nothing about trained weights (Barbero et al.
2025, "Round and Round We Go": a model can learn q and k whose scores do not decay). On held-out text we take every
layer's pre-softmax logits (`roformer.model.attention.attention_logits`, fed each layer's own input and context by a
forward pre-hook) and its softmax weights, and average both over heads, queries and samples at each distance
|m - n| (per head too), for any position encoding with softmax attention: rotary, sinusoidal, learned, Shaw, T5's
bias, ALiBi or none. For ALiBi an untrained model's mean logit falls by each head's slope per token (what its bias
adds), which the tests check.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from roformer.data.text import expand_paths, read_documents
from roformer.data.tokenizer import Tokenizer, jieba_presegmenter, load_tokenizer, segmentation
from roformer.errors import UserError, naming
from roformer.files import atomic_write, atomic_write_text, check_output_file
from roformer.model.attention import SelfAttention, attention_logits, masked_softmax
from roformer.model.model import Model, load
from roformer.model.rotary import rotary_frequencies
from roformer.study.length_eval import check_device, default_device
from roformer.study.plots import plot_attention_distance

FIGURE_HEAD_SIZE = 128  # the head size we draw fig. 2 at (see the module docstring: an assumption)
TABLE_DISTANCES = (10, 20, 50, 100, 150, 200, 256)  # where docs/length-generalization.md tabulates the bound
TOKENIZE_CHUNK = 256  # documents tokenized at a time, until the windows are filled


# ----------------------------------------------------------------------------------------------------------------
# The bound


def relative_upper_bound(
    distances: Sequence[float] | Tensor, head_size: int = FIGURE_HEAD_SIZE, base: float = 10000.0
) -> Tensor:
    """The paper's relative upper bound (1/(d/2)) sum_{j=1}^{d/2} |S_j| at each relative distance (fig. 2).

    S_j = sum_{k=0}^{j-1} e^{i r theta_k}, theta_k = base^(-2k/d) (the frequencies the model rotates by), in float64.

    Args:
        distances: Relative distances r = m - n (any real numbers; the bound is even in r).
        head_size: d, the rotated features of a head (even).
        base: The rotary base (10000 in the paper).

    Returns:
        (R,) float64, one value per distance; (d/2 + 1) / 2 at r = 0.

    Raises:
        ValueError: a head size that is not an even number >= 2.
    """
    if head_size < 2 or head_size % 2:
        raise ValueError(f"head_size must be an even number >= 2, got {head_size}")
    r = torch.as_tensor(distances, dtype=torch.float64).reshape(-1)
    theta, _ = rotary_frequencies(head_size, base)  # (d/2,) float64
    angles = r[:, None] * theta[None, :]  # (R, d/2)
    partial_sums = torch.polar(torch.ones_like(angles), angles).cumsum(dim=-1)  # S_1 .. S_{d/2}
    return partial_sums.abs().mean(dim=-1)


# ----------------------------------------------------------------------------------------------------------------
# The measured decay


@dataclass(frozen=True)
class DistanceSettings:
    """What `roformer attention-distance` measures, checked on construction.

    Attributes:
        length: Tokens per window, [CLS] and [SEP] included (>= 3).
        samples: Windows of held-out text (at most; fewer when the text is shorter).
        batch_size: Windows per forward.
    """

    length: int = 256
    samples: int = 32
    batch_size: int = 8

    def __post_init__(self) -> None:
        if self.length < 3:
            raise UserError(f"--length must be >= 3 ([CLS], a token, [SEP]), got {self.length}")
        if self.samples < 1 or self.batch_size < 1:
            raise UserError(f"--samples and --batch-size must be >= 1, got {self.samples} and {self.batch_size}")


class DistanceCurves:
    """One layer's running sums of logits and softmax weights per head and distance |m - n|."""

    def __init__(self, heads: int, length: int) -> None:
        self.logit_sums = torch.zeros(heads, length, dtype=torch.float64)
        self.weight_sums = torch.zeros(heads, length, dtype=torch.float64)
        self.pairs = torch.zeros(heads, length, dtype=torch.float64)  # attended (query, key) pairs
        self._distance: Tensor | None = None

    def add(self, logits: Tensor) -> None:
        """Add a batch's logits (B, H, T, T), -inf where a key is not attended."""
        T = logits.shape[-1]
        if self._distance is None:
            positions = torch.arange(T)
            self._distance = (positions[:, None] - positions[None, :]).abs().flatten()  # (T * T,)
        attended = torch.isfinite(logits)
        weights = masked_softmax(logits)
        finite = logits.masked_fill(~attended, 0.0)

        def per_distance(values: Tensor) -> Tensor:  # (B, H, T, T) -> (H, T): summed over batch and pairs
            summed = values.sum(dim=0, dtype=torch.float64).flatten(1).cpu()  # (H, T * T)
            return torch.zeros(summed.shape[0], T, dtype=torch.float64).index_add_(1, self._distance, summed)

        self.logit_sums += per_distance(finite)
        self.weight_sums += per_distance(weights)
        self.pairs += per_distance(attended.float())

    def means(self) -> dict[str, Any]:
        """The layer's mean logit and weight at each distance, over its heads and per head (None: no pair there)."""
        heads = {"mean_logit": _rows(self.logit_sums, self.pairs), "mean_weight": _rows(self.weight_sums, self.pairs)}
        total = self.pairs.sum(dim=0, keepdim=True)
        return {
            "mean_logit": _rows(self.logit_sums.sum(dim=0, keepdim=True), total)[0],
            "mean_weight": _rows(self.weight_sums.sum(dim=0, keepdim=True), total)[0],
            "heads": heads,
        }


def _rows(sums: Tensor, counts: Tensor) -> list[list[float | None]]:
    means = sums / counts.clamp(min=1)
    return [[round(float(m), 7) if c > 0 else None for m, c in zip(row, count)] for row, count in zip(means, counts)]


@torch.no_grad()
def measure_attention_distance(model: Model, windows: Tensor, batch_size: int = 8) -> list[DistanceCurves]:
    """Every layer's logits and weights by distance over token-id windows (S, T) of full rows (no padding).

    Each layer's attention module gets a forward pre-hook that computes its logits from the input and context the
    forward plan gave it (`attention_logits`), so the numbers are those of the model's own forward.

    Raises:
        ValueError: linear attention (no softmax logits).
    """
    backbone = model.base_model
    config = backbone.config
    device = next(backbone.parameters()).device
    curves = [DistanceCurves(config.num_heads, windows.shape[1]) for _ in backbone.layers]

    def recorder(layer: int) -> Callable[[SelfAttention, tuple[Any, ...]], None]:
        def record(module: SelfAttention, args: tuple[Any, ...]) -> None:
            x, ctx = args
            curves[layer].add(attention_logits(module, x, ctx))

        return record

    hooks = [block.attn.register_forward_pre_hook(recorder(i)) for i, block in enumerate(backbone.layers)]
    try:
        for start in range(0, len(windows), batch_size):
            backbone.encode(windows[start : start + batch_size].to(device))
    finally:
        for hook in hooks:
            hook.remove()
    return curves


def text_windows(tokenizer: Tokenizer, folder: str | Path, length: int, samples: int, segment: bool) -> Tensor:
    """Up to `samples` windows `[CLS] body [SEP]` of `length` tokens: the folder's text, cut in order.

    Every text file under `folder` (as `roformer.data.text` reads them: .txt paragraphs, .jsonl / .csv / .parquet
    records), in sorted order, tokenized and joined into one stream (as pretraining packs documents), then cut into
    consecutive windows that do not overlap; tokenizing stops once they are filled.

    Raises:
        UserError: no text at `folder`, or less than one window of it, naming `--data`.
    """
    body = length - 2
    stream: list[int] = []
    presegment = jieba_presegmenter(tokenizer) if segment else None
    with naming("--data"):
        for chunk in _document_chunks(folder):
            texts = [presegment(d) for d in chunk] if presegment is not None else chunk
            stream += [token for row in tokenizer(texts, add_special_tokens=False)["input_ids"] for token in row]
            if len(stream) >= samples * body:
                break
        if len(stream) < body:
            raise UserError(f"{folder}: only {len(stream)} tokens of text; a window of --length {length} needs {body}")
    count = min(samples, len(stream) // body)
    rows = [[tokenizer.cls_token_id, *stream[i * body : (i + 1) * body], tokenizer.sep_token_id] for i in range(count)]
    return torch.tensor(rows)


def _document_chunks(folder: str | Path) -> Iterator[list[str]]:
    """The folder's documents, TOKENIZE_CHUNK at a time."""
    chunk: list[str] = []
    for path in expand_paths([str(folder)]):
        for document in read_documents(path, decode_errors="replace"):
            chunk.append(document)
            if len(chunk) == TOKENIZE_CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


# Above this share of [UNK] in the windows the model cannot read the text (a synthetic task's word-level vocabulary
# on prose reads 99.9% [UNK]): the curves would be those of one repeated token, so the study refuses. Real text under
# its own tokenizer is below 1%; 5% leaves room for rare scripts and symbols.
MAX_UNKNOWN_RATE = 0.05


def unknown_rate(windows: Tensor, tokenizer: Tokenizer) -> float:
    """The share of [UNK] among the windows' text tokens ([CLS] and [SEP] left out; 0 for a tokenizer without one)."""
    unk = tokenizer.unk_token_id
    return 0.0 if unk is None else float(windows[:, 1:-1].eq(unk).float().mean())


def check_readable(rate: float, data: str | Path, model_dir: str | Path) -> None:
    """Refuse text the model's tokenizer cannot read (more than MAX_UNKNOWN_RATE of it [UNK]).

    Raises:
        UserError: naming --data, the rate and the limit.
    """
    if rate > MAX_UNKNOWN_RATE:
        raise UserError(
            f"--data {data}: {rate:.1%} of its tokens are [UNK] to {model_dir}'s tokenizer (more than "
            f"{MAX_UNKNOWN_RATE:.0%}): the model cannot read this text; give text of its language and vocabulary"
        )


def bound_for(model: Model, length: int) -> dict[str, Any]:
    """The paper's bound at distances 0..length-1, at the model's rotated head size and base.

    RoPE's bound whatever the model's encoding: it is drawn beside the measured curves for comparison.
    """
    config = model.config
    rotary = config.position_encoding == "rotary"
    head_size = config.rotary_size if rotary else config.head_size - config.head_size % 2
    base = config.rotary_base if rotary else 10000.0
    values = relative_upper_bound(range(length), head_size, base)
    return {"head_size": head_size, "base": base, "relative_upper_bound": [round(float(v), 6) for v in values]}


def check_model(model: Model, model_dir: str | Path, length: int) -> None:
    """Refuse a model this study cannot measure at `length`.

    Raises:
        UserError: linear attention (no softmax logits), or a length beyond a learned position table.
    """
    config = model.config
    if config.attention == "linear":
        raise UserError(f"--model {model_dir}: linear attention has no softmax logits to measure (softmax only)")
    if not config.holds_positions(length):
        raise UserError(
            f"--length {length}: {model_dir} has learned positions for {config.max_position_embeddings} tokens"
        )


def run_attention_distance(
    model_dir: str | Path,
    data: str | Path,
    settings: DistanceSettings,
    out: str | Path,
    device: str | None = None,
    overwrite: bool = False,
) -> tuple[dict[str, Any], Path]:
    """`roformer attention-distance`: check the inputs, measure every layer, write the JSON and its plot.

    The plot is the JSON's path with `.png`; both are written whole or not at all.

    Returns:
        The results and the plot's path.

    Raises:
        UserError: an output in the way, a model that does not load or cannot be measured (linear attention, a
            length beyond learned positions), no tokenizer beside it, a data folder without a window of text.
    """
    out = Path(out)
    plot = out.with_suffix(".png")
    for path in (out, plot):
        check_output_file(path)
        if path.exists() and not overwrite:
            raise UserError(f"{path} exists (--overwrite replaces it)")
    device = device or default_device()
    check_device(device)
    with naming("--model"):
        model = load(model_dir, device=device).eval()
        tokenizer = load_tokenizer(model_dir)
        segment = segmentation(tokenizer, None, model_dir)
    check_model(model, model_dir, settings.length)
    windows = text_windows(tokenizer, data, settings.length, settings.samples, segment)
    rate = unknown_rate(windows, tokenizer)
    check_readable(rate, data, model_dir)
    result = attention_distance(model, windows, str(model_dir), str(data), settings.batch_size, rate)
    write_attention_distance(result, out)
    return result, plot


def attention_distance(
    model: Model, windows: Tensor, model_name: str, data: str, batch_size: int = 8, unknown: float | None = None
) -> dict[str, Any]:
    """What `roformer attention-distance` writes of `model` over token-id `windows` (S, T) (no padding).

    `unknown`, the windows' share of [UNK] (`unknown_rate`), is written when given.
    """
    curves = measure_attention_distance(model, windows, batch_size)
    config, length = model.config, windows.shape[1]
    return {
        "model": model_name,
        "data": data,
        "position_encoding": config.position_encoding,
        "attention_pattern": config.attention_pattern,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "head_size": config.head_size,
        "length": length,
        "samples": len(windows),
        **({"unknown_rate": unknown} if unknown is not None else {}),
        "distances": list(range(length)),
        "pairs": [int(p) for p in curves[0].pairs[0]],  # (query, key) pairs per head at each distance
        "layers": [{"layer": i, **layer.means()} for i, layer in enumerate(curves)],
        "bound": bound_for(model, length),
    }


def write_attention_distance(result: dict[str, Any], out: Path) -> None:
    """The JSON at `out` and its plot beside it (`.png`), each whole or absent."""
    plot = out.with_suffix(".png")
    atomic_write(plot, lambda tmp: plot_attention_distance(result, tmp))
    atomic_write_text(out, json.dumps(result, indent=1))
