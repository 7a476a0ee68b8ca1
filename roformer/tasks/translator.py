"""Translating sentences with an encoder-decoder: encoding, length limits, beam search, decoded hypotheses.

Shared by the `translation` type (its dev and test predictions) and `roformer translate` (a model directory), so that
the two give the same hypotheses: the same source encoding and limits, batches of the same sentences in order of
source length, padded alike, the same search. `Decoding` is what a model directory records of how its run decoded
(`translation.json`, written beside every model the type trains); `Translator` translates lines with a directory.

A source (or a training target) longer than the limit is an error naming its file and line, or, when asked
(`too_long: truncate`), cut to the limit and counted in a log line: never dropped in silence.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from roformer.errors import UserError
from roformer.tasks.base import padded_length
from roformer.tasks.parallel import load_translation_tokenizer

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.seq2seq import EncoderDecoder

logger = logging.getLogger(__name__)

DECODING_FILE = "translation.json"  # beside a model the `translation` type trained: how its run decoded


@dataclass(frozen=True)
class Decoding:
    """How sources become hypotheses, and in what batches.

    Attributes:
        beam: Beams per source (1: greedy).
        length_penalty: Hypotheses score sum logprob / length^length_penalty (fairseq's `--lenpen`).
        early_stopping: Stop a source once it has `beam` finished hypotheses (HF's `early_stopping: true`).
        max_len_a: A target may have max_len_a x source tokens + max_len_b tokens (fairseq's `--max-len-a/-b`).
        max_len_b: See max_len_a.
        max_length: The longest source, in tokens with its specials.
        too_long: A longer source is an `error` (naming its line) or is cut to max_length (`truncate`, counted).
        batch_size: Sentences per batch, taken in order of source length.
        pad_to_multiple_of: A batch's sources are padded to a multiple of this (within max_length).
        source_lang: The source language, where known (for the command's messages).
        target_lang: The target language, where known.
    """

    beam: int = 4
    length_penalty: float = 0.6
    early_stopping: bool = True
    max_len_a: float = 1.2
    max_len_b: int = 10
    max_length: int = 512
    too_long: Literal["error", "truncate"] = "error"
    batch_size: int = 64
    pad_to_multiple_of: int = 8
    source_lang: str | None = None
    target_lang: str | None = None

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise UserError(f"beam must be >= 1, got {self.beam}")
        if self.batch_size < 1 or self.max_length < 2 or self.pad_to_multiple_of < 1:
            raise UserError("batch_size and pad_to_multiple_of must be >= 1 and max_length >= 2")
        for name in ("length_penalty", "max_len_a"):  # nan passes every range check, and reorders the beams
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise UserError(f"max_len_a and max_len_b must be >= 0, got {self.max_len_a}, {self.max_len_b}")
        if self.too_long not in ("error", "truncate"):
            raise UserError(f"too_long must be error or truncate, got {self.too_long!r}")

    def search(self) -> dict[str, Any]:
        """The keyword arguments of `EncoderDecoder.generate`."""
        return {
            "num_beams": self.beam,
            "length_penalty": self.length_penalty,
            "early_stopping": self.early_stopping,
            "max_new_tokens": self.max_len_b,
            "max_len_a": self.max_len_a,
        }

    def to_json(self) -> str:
        """The settings as `translation.json` holds them."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def read(cls, directory: Path) -> Decoding | None:
        """The settings a model directory records, or None when it has none (a converted model).

        Raises:
            UserError: the file is not such settings.
        """
        path = directory / DECODING_FILE
        if not path.is_file():
            return None
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in values.items() if k in known})
        except (ValueError, TypeError, UserError) as e:  # not JSON, not a mapping, a value out of range
            raise UserError(f"{path}: not decoding settings ({e})") from None


# ----------------------------------------------------------------------------------------------------------------
# Encoding


def encode_sources(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_length: int,
    too_long: str,
    where: Callable[[int], str],
    advice: str,
) -> list[list[int]]:
    """Every source as ids, the tokenizer's specials included (ours: the sentence, then </s>).

    Args:
        tokenizer: The model's tokenizer.
        texts: The sources.
        max_length: The longest source accepted.
        too_long: `error` or `truncate` (cut to max_length, its specials kept; counted in a log line).
        where: The file and line of source i, for messages.
        advice: What lifts the limit, said with an error (`set data.translation.too_long: truncate ...`).

    Raises:
        UserError: a source longer than max_length under `error`, naming its file and line.
    """
    ids = tokenizer(list(texts))["input_ids"] if texts else []
    long = rows_to_cut(ids, "source", max_length, too_long, where, advice)
    if long:
        cut = tokenizer([texts[i] for i in long], truncation=True, max_length=max_length)["input_ids"]
        for i, row in zip(long, cut, strict=True):
            ids[i] = row
    return ids


def encode_targets(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    eos: int,
    max_length: int,
    too_long: str,
    where: Callable[[int], str],
    advice: str,
) -> list[list[int]]:
    """Every target as the ids the decoder learns to produce: its tokens, then `eos` (no start token: see seq2seq).

    Raises:
        UserError: a target longer than max_length under `error`, naming its file and line.
    """
    rows = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    ids = [row + [eos] for row in rows]
    for i in rows_to_cut(ids, "target", max_length, too_long, where, advice):
        ids[i] = ids[i][: max_length - 1] + [eos]
    return ids


def rows_to_cut(
    ids: Sequence[Sequence[int]], side: str, max_length: int, too_long: str, where: Callable[[int], str], advice: str
) -> list[int]:
    """The rows longer than max_length, which the caller cuts (`truncate`; counted in a log line).

    Raises:
        UserError: such a row under `error`, naming the first one's file and line.
    """
    long = [i for i, row in enumerate(ids) if len(row) > max_length]
    if long and too_long == "error":
        first = long[0]
        raise UserError(
            f"{where(first)}: the {side} has {len(ids[first])} tokens, more than the {max_length} accepted ({advice})"
        )
    if long:
        logger.info("%d %ss of %s cut to %d tokens", len(long), side, where(long[0]).rsplit(":", 1)[0], max_length)
    return long


def pad_sources(rows: Sequence[Sequence[int]], pad_id: int, multiple: int, cap: int) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` (B, S): the rows right-padded to the longest, rounded up to `multiple`."""
    length = padded_length(max(len(row) for row in rows), multiple, cap)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def length_order(lengths: Sequence[int]) -> list[int]:
    """Rows in order of length, ties in row order: the order prediction batches take them in."""
    return sorted(range(len(lengths)), key=lengths.__getitem__)


# ----------------------------------------------------------------------------------------------------------------
# Decoding


def generation_model(model: torch.nn.Module) -> EncoderDecoder:
    """The encoder-decoder inside a training wrapper (DDP's `module`, torch.compile's `_orig_mod`)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


@torch.no_grad()
def generate_ids(model: torch.nn.Module, batch: dict[str, torch.Tensor], decoding: Decoding) -> torch.Tensor:
    """(B, 1 + N) ids of the best target of every source of `batch` (`input_ids`, `attention_mask`).

    Under FSDP2 the root module's own parameters (embeddings, the output bias) are sharded until its forward runs:
    they are gathered around the search (`unshard`), the blocks gather theirs as they run.
    """
    bare = generation_model(model)
    sharded = hasattr(bare, "unshard") and hasattr(bare, "reshard")  # an FSDPModule
    if sharded:
        bare.unshard()
    try:
        return bare.generate(batch["input_ids"], batch["attention_mask"], **decoding.search())
    finally:
        if sharded:
            bare.reshard()


def hypotheses(tokenizer: Tokenizer, ids: torch.Tensor) -> list[str]:
    """The text of every row of generated ids (the start token, the target, eos and padding after its end)."""
    return tokenizer.batch_decode(ids[:, 1:].tolist(), skip_special_tokens=True)


def needed_ids(config: Any, where: str | Path) -> None:
    """An encoder-decoder must know the token targets start from and the one that ends them.

    Raises:
        UserError: the model is not an encoder-decoder, or its config lacks one of the two ids.
    """
    if not hasattr(config, "decoder"):
        raise UserError(f"{where}: not an encoder-decoder (translation needs one)")
    for name in ("decoder_start_token_id", "eos_token_id"):
        if getattr(config, name) is None:
            raise UserError(f"{where}: the encoder-decoder has no {name}, which decoding needs")


# ----------------------------------------------------------------------------------------------------------------
# Translating lines with a model directory


class Translator:
    """An encoder-decoder, its tokenizer and its decoding settings: lines in, hypotheses out.

    Args:
        model: The model, in eval mode.
        tokenizer: Its tokenizer.
        decoding: How to decode (the model directory's `translation.json`, with any overrides).
    """

    def __init__(self, model: EncoderDecoder, tokenizer: Tokenizer, decoding: Decoding) -> None:
        self.model, self.tokenizer, self.decoding = model, tokenizer, decoding

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None, **overrides: Any) -> Translator:
        """The translator of a model directory (ours, or an HF EncoderDecoderModel's) with settings `overrides`.

        Raises:
            UserError: no encoder-decoder or tokenizer there, a tokenizer without padding, no start or end id.
        """
        from roformer.model.pretrained import load_pretrained

        directory = Path(directory)
        if not directory.is_dir():
            raise UserError(f"{directory}: model directory not found")
        tokenizer = load_translation_tokenizer(directory)
        model = load_pretrained(directory, "encoder_decoder")
        needed_ids(model.config, directory)
        decoding = Decoding.read(directory) or Decoding(max_length=source_limit(model.config))
        decoding = replace(decoding, **{k: v for k, v in overrides.items() if v is not None})
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = model.to(device).eval()
        model.set_unpadding(True)  # as training evaluates (train.unpadding's default): the same numbers
        return cls(model, tokenizer, decoding)

    def translate(
        self, lines: Sequence[str], where: Callable[[int], str], progress: Callable[[int], None] | None = None
    ) -> list[str]:
        """The hypothesis of every line (an empty line gives an empty one), in order.

        Args:
            lines: The source sentences, one a line.
            where: The file and line of line i, for messages.
            progress: Called with the number of sentences of each batch done.

        Raises:
            UserError: a line longer than the model takes under `too_long: error`, before any translation.
        """
        texts = [line.strip() for line in lines]
        kept = [i for i, text in enumerate(texts) if text]
        advice = "--too-long truncate cuts such lines"
        limits = (self.decoding.max_length, self.decoding.too_long)
        sources = encode_sources(self.tokenizer, [texts[i] for i in kept], *limits, lambda k: where(kept[k]), advice)
        out = [""] * len(texts)
        order = length_order([len(row) for row in sources])
        size, device = self.decoding.batch_size, next(self.model.parameters()).device
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            batch = pad_sources([sources[r] for r in rows], self.tokenizer.pad_token_id, *self._padding())
            ids = generate_ids(self.model, {k: v.to(device) for k, v in batch.items()}, self.decoding)
            for r, text in zip(rows, hypotheses(self.tokenizer, ids.cpu()), strict=True):
                out[kept[r]] = text
            if progress is not None:
                progress(len(rows))
        return out

    def _padding(self) -> tuple[int, int]:
        return self.decoding.pad_to_multiple_of, self.decoding.max_length


def source_limit(config: Any) -> int:
    """The longest source a model takes by its own config: its encoder's positions (a table, or the nominal count)."""
    return config.encoder.max_position_embeddings
