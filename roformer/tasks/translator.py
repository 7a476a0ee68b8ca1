"""Translating sentences with an encoder-decoder: encoding, length limits, beam search, decoded hypotheses.

Shared by the `translation` type (its dev and test predictions) and `roformer translate` (a model directory), so that
the two give the same hypotheses: the same source encoding and limits, batches of the same sentences in order of
source length, padded alike, the same search. `Decoding` is what a model directory records of how its run decoded
(its `SearchConfig`, limits and batches: `translation.json`, written beside every model the type trains);
`Translator` translates lines with a directory. USER_NAMES is where the search's settings get the names users write
(`data.translation.beam`, translation.json's `beam`, `--beam`: the search's `num_beams`).

A source (or a training target) longer than the limit is an error naming its file and line, or, when asked
(`too_long: truncate`), cut to the limit and counted in a log line: never dropped in silence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from roformer.errors import UserError
from roformer.model.search import SearchConfig, SearchValueError
from roformer.tasks.base import padded_length
from roformer.tasks.parallel import load_translation_tokenizer

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.seq2seq import EncoderDecoder

logger = logging.getLogger(__name__)

DECODING_FILE = "translation.json"  # beside a model the `translation` type trained: how its run decoded

# The search's fields under the names translation's users write them (fairseq's): the keys of `data.translation`,
# of `translation.json` and of results.json's `search`, and `roformer translate --beam` / `--length-penalty`.
USER_NAMES = {
    "num_beams": "beam",
    "length_penalty": "length_penalty",
    "early_stopping": "early_stopping",
    "max_len_a": "max_len_a",
    "max_new_tokens": "max_len_b",
}
# translation's search where nothing says otherwise (a model without translation.json, the config's defaults): the
# paper's beam 4 and length penalty 0.6, at most 1.2 x source tokens + 10 (fairseq's max_len_a and max_len_b)
PAPER_SEARCH = SearchConfig(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=10, max_len_a=1.2)


def user_search(values: Mapping[str, Any], names: Mapping[str, str] = USER_NAMES) -> SearchConfig:
    """The search of settings under their users' names (`beam`, `max_len_b`: USER_NAMES), the paper's where missing.

    Args:
        values: The settings, by their users' names (other keys are not read).
        names: {SearchConfig field: its name in `values`} (the dev search reads `eval_beam` for `num_beams`).

    Raises:
        SearchValueError: a value out of range, named as in `values` (`beam must be >= 1, got 0`).
    """
    given = {field: values[name] for field, name in names.items() if name in values}
    try:
        return replace(PAPER_SEARCH, **given)
    except SearchValueError as e:
        raise SearchValueError(names[e.field], e.problem) from None


def user_settings(search: SearchConfig) -> dict[str, Any]:
    """The search's settings under its users' names, in USER_NAMES' order (translation.json's first keys)."""
    return {name: getattr(search, field) for field, name in USER_NAMES.items()}


@dataclass(frozen=True)
class Decoding:
    """How sources become hypotheses, and in what batches: the search, and the sources' limits and batches.

    As `translation.json` holds it, the search's settings come first under their users' names (`beam`,
    `length_penalty`, `early_stopping`, `max_len_a`, `max_len_b`: USER_NAMES), then the other attributes.

    Attributes:
        search: The search (the paper's by default: beam 4, length penalty 0.6, early stopping, 1.2 x source tokens
            + 10).
        max_length: The longest source, in tokens with its specials.
        too_long: A longer source is an `error` (naming its line) or is cut to max_length (`truncate`, counted).
        batch_size: Sentences per batch, taken in order of source length.
        pad_to_multiple_of: A batch's sources are padded to a multiple of this (within max_length).
        source_lang: The source language, where known (for the command's messages).
        target_lang: The target language, where known.
    """

    search: SearchConfig = PAPER_SEARCH
    max_length: int = 512
    too_long: Literal["error", "truncate"] = "error"
    batch_size: int = 64
    pad_to_multiple_of: int = 8
    source_lang: str | None = None
    target_lang: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_length < 2 or self.pad_to_multiple_of < 1:
            raise UserError("batch_size and pad_to_multiple_of must be >= 1 and max_length >= 2")
        if self.too_long not in ("error", "truncate"):
            raise UserError(f"too_long must be error or truncate, got {self.too_long!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Decoding:
        """The settings of a mapping of `translation.json`'s keys; a missing key takes its default.

        Raises:
            UserError: a key that is none of them, or a value out of range, named by its key.
        """
        unknown = sorted(set(values) - set(cls.file_keys()))
        if unknown:
            raise UserError(f"unknown decoding settings: {', '.join(unknown)} (known: {', '.join(cls.file_keys())})")
        try:
            search = user_search(values)
        except SearchValueError as e:
            raise UserError(str(e)) from None
        return cls(search, **{k: v for k, v in values.items() if k not in USER_NAMES.values()})

    @classmethod
    def file_keys(cls) -> list[str]:
        """`translation.json`'s keys, in its order."""
        return [*USER_NAMES.values(), *(f.name for f in fields(cls) if f.name != "search")]

    def to_dict(self) -> dict[str, Any]:
        """The settings under `translation.json`'s keys, in its order."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "search"}
        return {**user_settings(self.search), **own}

    def overridden(self, values: Mapping[str, Any]) -> Decoding:
        """These settings with `values` (by `translation.json`'s keys: `beam`, `batch_size`) in place of theirs.

        Raises:
            UserError: an unknown key, or a value out of range.
        """
        return self.from_dict({**self.to_dict(), **values})

    def to_json(self) -> str:
        """The settings as `translation.json` holds them."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def read(cls, directory: Path) -> Decoding | None:
        """The settings a model directory records, or None when it has none (a converted model).

        Keys this version does not know are not read.

        Raises:
            UserError: the file is not such settings.
        """
        path = directory / DECODING_FILE
        if not path.is_file():
            return None
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            return cls.from_dict({k: v for k, v in values.items() if k in cls.file_keys()})
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
def generate_ids(model: torch.nn.Module, batch: dict[str, torch.Tensor], search: SearchConfig) -> torch.Tensor:
    """(B, 1 + N) ids of the best target of every source of `batch` (`input_ids`, `attention_mask`) under `search`.

    Under FSDP2 the root module's own parameters (embeddings, the output bias) are sharded until its forward runs:
    they are gathered around the search (`unshard`), the blocks gather theirs as they run.
    """
    bare = generation_model(model)
    sharded = hasattr(bare, "unshard") and hasattr(bare, "reshard")  # an FSDPModule
    if sharded:
        bare.unshard()
    try:
        return bare.generate(batch["input_ids"], batch["attention_mask"], search=search)
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

        Args:
            directory: The model directory.
            device: Where the model runs (default: cuda when there is one, else cpu).
            overrides: Settings in place of the directory's `translation.json`, by its keys (`beam`, `batch_size`:
                `roformer translate`'s flags); None leaves one as it is.

        Raises:
            UserError: no encoder-decoder or tokenizer there, a tokenizer without padding, no start or end id; an
                override that is no setting, or out of range.
        """
        from roformer.model.pretrained import load_pretrained

        directory = Path(directory)
        if not directory.is_dir():
            raise UserError(f"{directory}: model directory not found")
        tokenizer = load_translation_tokenizer(directory)
        model = load_pretrained(directory, "encoder_decoder")
        needed_ids(model.config, directory)
        decoding = Decoding.read(directory) or Decoding(max_length=source_limit(model.config))
        decoding = decoding.overridden({k: v for k, v in overrides.items() if v is not None})
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
            ids = generate_ids(self.model, {k: v.to(device) for k, v in batch.items()}, self.decoding.search)
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
