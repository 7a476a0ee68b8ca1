"""Parallel text for translation: fairseq's files, the hub's `translation` records, and the joint BPE tokenizer.

Files are named as fairseq names them (`fairseq-preprocess --trainpref PREFIX --source-lang en --target-lang de`):
PREFIX.en and PREFIX.de, or their gzipped PREFIX.en.gz and PREFIX.de.gz, one sentence a line, the pair by line
number. Every line is read as UTF-8 (a leading byte-order mark is dropped; a line ends at a newline, a carriage
return, or the two); a line that is not, an empty line, a missing file and files of different line counts are errors
naming the file and line (`UserError`), never a pair silently lost. A hub dataset (`datasets`: WMT14's
`wmt14`, `de-en`) holds records `{"translation": {"de": ..., "en": ...}}`.

The tokenizer is one BPE vocabulary for both languages (fairseq's joint BPE with `--share-all-embeddings`), trained with
`tokenizers` on the training split's two sides: SentencePiece's whitespace handling (`Metaspace`: a word's first piece
starts with `▁`) and punctuation split from words, so that decoding gives back the text exactly, spaces and case
included, as sacreBLEU wants detokenized hypotheses. Specials: `<pad>` 0, `<unk>` 1, `<s>` 2 (the decoder's start) and
`</s>` 3 (the end of every sentence: fairseq appends it to the source and the target alike).
"""

from __future__ import annotations

import gzip
import io
import logging
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from roformer.errors import UserError

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIALS = (PAD, UNK, BOS, EOS)  # in id order
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape decodes it


@dataclass
class ParallelText:
    """One split's sentence pairs and where each was read (for messages).

    Attributes:
        sources: The source sentences, stripped of surrounding whitespace.
        targets: Their translations, in the same order.
        source_file: Where the sources were read (a path, or `hub name:split`).
        target_file: Where the targets were read.
        lines: The line (1-based; a hub row's index + 1) of every pair in its files.
    """

    sources: list[str]
    targets: list[str]
    source_file: str
    target_file: str
    lines: list[int]

    def __len__(self) -> int:
        return len(self.sources)

    def source_line(self, pair: int) -> str:
        """Where pair `pair`'s source is: `file:line`."""
        return f"{self.source_file}:{self.lines[pair]}"

    def target_line(self, pair: int) -> str:
        """Where pair `pair`'s target is: `file:line`."""
        return f"{self.target_file}:{self.lines[pair]}"

    def head(self, count: int | None) -> ParallelText:
        """The first `count` pairs (None: all)."""
        if count is None:
            return self
        return ParallelText(
            self.sources[:count], self.targets[:count], self.source_file, self.target_file, self.lines[:count]
        )

    def pairs(self, keep: list[int]) -> ParallelText:
        """The pairs at the indices `keep`, in that order (their file lines kept for messages)."""
        return ParallelText(
            [self.sources[i] for i in keep],
            [self.targets[i] for i in keep],
            self.source_file,
            self.target_file,
            [self.lines[i] for i in keep],
        )

    def split_by_source_words(self, max_words: int) -> tuple[ParallelText, ParallelText]:
        """(pairs whose source has at most `max_words` words, the rest), each in file order.

        Words are the source's whitespace-separated tokens, as a length split of the literature counts them
        (Rosendahl et al. 2019 train on short sentences and test on longer ones).
        """
        short = [i for i, text in enumerate(self.sources) if source_words(text) <= max_words]
        chosen = set(short)
        return self.pairs(short), self.pairs([i for i in range(len(self)) if i not in chosen])


def source_words(text: str) -> int:
    """The words of a sentence: its whitespace-separated tokens (before any subword tokenization)."""
    return len(text.split())


# ----------------------------------------------------------------------------------------------------------------
# Files


def side_file(prefix: str | Path, lang: str) -> Path:
    """PREFIX.<lang>, or PREFIX.<lang>.gz when only that one exists.

    Raises:
        UserError: neither exists.
    """
    plain = Path(f"{prefix}.{lang}")
    gzipped = Path(f"{plain}.gz")
    if plain.is_file():
        return plain
    if gzipped.is_file():
        return gzipped
    raise UserError(f"{plain}: file not found (nor {gzipped.name})")


def read_lines(path: Path) -> list[str]:
    """Every line of a UTF-8 text file (gzipped when it ends in .gz), as `split_lines` reads them.

    Raises:
        UserError: a line that is not UTF-8 (file:line and the byte), a damaged gzip file, an unreadable file.
    """
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as f:
            return split_lines(f, path)
    except (OSError, EOFError, zlib.error) as e:  # gzip raises BadGzipFile (an OSError), EOFError when cut short
        raise UserError(f"{path}: cannot read ({e})") from None


def split_lines(stream: BinaryIO, path: Path) -> list[str]:
    """Every line of a UTF-8 byte stream without its line end: a newline, a carriage return, or the two together.

    A byte-order mark at the start is not text (Windows editors write one), and a file saved with carriage returns
    alone (classic Mac OS) has as many lines as it has returns, not one.

    Raises:
        UserError: a line that is not UTF-8, naming the file, line, column and byte.
    """
    # utf-8-sig drops a leading mark; newline=None reads every line end as "\n"; surrogateescape keeps a bad byte
    # as one character (U+DC80 + byte), so that the line, column and byte can still be named
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline=None)
    try:
        return [checked_line(line.removesuffix("\n"), path, number) for number, line in enumerate(text, start=1)]
    finally:
        text.detach()  # the caller closes its own stream


def checked_line(line: str, path: Path, number: int) -> str:
    """`line` if every byte of it was UTF-8.

    Raises:
        UserError: an undecodable byte, naming the file, line, column and byte.
    """
    found = ESCAPED_BYTE.search(line)
    if found is None:
        return line
    bad = found.start()
    column = len(line[:bad].encode("utf-8", "surrogateescape")) + 1  # in bytes, as the file has them
    raise UserError(
        f"{path}:{number}: not UTF-8 (byte 0x{ord(line[bad]) - 0xDC00:02x} at column {column}); parallel text is "
        "read as UTF-8"
    )


def read_parallel(prefix: str | Path, source_lang: str, target_lang: str, skip_empty: bool = False) -> ParallelText:
    """The pairs of PREFIX.<source_lang> and PREFIX.<target_lang>, paired by line number.

    Args:
        prefix: The files' common prefix (fairseq's `--trainpref`).
        source_lang: The source files' suffix.
        target_lang: The target files' suffix.
        skip_empty: Leave out pairs with an empty side (counted in a log line) instead of refusing them.

    Raises:
        UserError: a missing file, files of different line counts, an empty line (unless `skip_empty`), a line that
            is not UTF-8.
    """
    source_path, target_path = side_file(prefix, source_lang), side_file(prefix, target_lang)
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise UserError(
            f"{source_path} has {len(sources)} lines and {target_path} {len(targets)}: parallel files pair their "
            "sentences by line number"
        )
    return pairs_of(sources, targets, str(source_path), str(target_path), skip_empty, start=1)


def pairs_of(
    sources: list[str], targets: list[str], source_file: str, target_file: str, skip_empty: bool, start: int
) -> ParallelText:
    """Pairs of stripped sentences; one with an empty side is refused (or left out and counted, `skip_empty`).

    Raises:
        UserError: an empty line, naming its file and line (`start` numbers the first pair).
    """
    kept_sources, kept_targets, lines, skipped = [], [], [], 0
    for offset, (source, target) in enumerate(zip(sources, targets, strict=True)):
        source, target = source.strip(), target.strip()
        if not source or not target:
            if skip_empty:
                skipped += 1
                continue
            raise UserError(empty_line_message(source, source_file, target_file, start + offset))
        kept_sources.append(source)
        kept_targets.append(target)
        lines.append(start + offset)
    if skipped:
        logger.info("%s / %s: %d pairs with an empty side left out", source_file, target_file, skipped)
    return ParallelText(kept_sources, kept_targets, source_file, target_file, lines)


def empty_line_message(source: str, source_file: str, target_file: str, line: int) -> str:
    """Why a pair with an empty side is refused, naming the empty side's file and line."""
    empty, other = (source_file, target_file) if not source else (target_file, source_file)
    return (
        f"{empty}:{line}: empty line (in a pair, with {other}:{line}): a pair needs a sentence on both sides "
        "(data.translation.empty_lines: skip leaves such training pairs out)"
    )


# ----------------------------------------------------------------------------------------------------------------
# The hub


def read_hub_pairs(
    name: str, config: str | None, split: str, source_lang: str, target_lang: str, skip_empty: bool = False
) -> ParallelText:
    """The pairs of a hub dataset's split whose rows are `{"translation": {lang: sentence, ...}}` (WMT14).

    Raises:
        UserError: the dataset or split does not load, its rows are not such records, a language is not in them, an
            empty sentence (unless `skip_empty`).
    """
    from datasets import load_dataset

    where = f"{name}:{split}"
    try:
        rows = load_dataset(name, config, split=split)
    except Exception as e:  # no network, an unknown name or split: datasets raises many types
        raise UserError(f"{where}: cannot load the hub dataset ({str(e).splitlines()[0] if str(e) else e!r})") from None
    if "translation" not in rows.column_names:
        raise UserError(f"{where}: rows without a `translation` field (columns: {', '.join(rows.column_names)})")
    records = rows["translation"]
    for lang in (source_lang, target_lang):
        if records and lang not in records[0]:
            raise UserError(f"{where}: no language {lang!r} in its records (it has {', '.join(sorted(records[0]))})")
    sources = [r[source_lang] or "" for r in records]
    targets = [r[target_lang] or "" for r in records]
    return pairs_of(sources, targets, f"{where}:{source_lang}", f"{where}:{target_lang}", skip_empty, start=1)


# ----------------------------------------------------------------------------------------------------------------
# The joint BPE tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """A BPE tokenizer of `vocab_size` ids trained on `texts` (both languages: one joint vocabulary).

    Returns:
        A transformers fast tokenizer with <pad>=0, <unk>=1, <s>=2, </s>=3; encoding a text appends </s>.
    """
    from tokenizers import Tokenizer as Pipeline
    from tokenizers import decoders, models, pre_tokenizers, trainers

    pipeline = Pipeline(models.BPE(unk_token=UNK))
    # words at spaces (kept as `▁`), punctuation apart from them: `▁Gitarre` `,`, not a `▁Gitarre,` of its own
    # (Moses' tokenizer does this before fairseq's BPE); decoding still gives the text back exactly
    pipeline.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    pipeline.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIALS),
        show_progress=sys.stderr.isatty(),  # its bar is blank lines on a log file or a pipe
    )
    pipeline.train_from_iterator(texts, trainer)
    return wrap_translation_tokenizer(pipeline)


def wrap_translation_tokenizer(pipeline: object) -> Tokenizer:
    """A `tokenizers` pipeline with our specials as a transformers fast tokenizer that ends every text with </s>.

    Raises:
        UserError: the pipeline lacks one of the specials.
    """
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    missing = [token for token in SPECIALS if pipeline.token_to_id(token) is None]
    if missing:
        raise UserError(
            f"the tokenizer has no {', '.join(missing)} (a translation tokenizer needs {', '.join(SPECIALS)})"
        )
    if pipeline.post_processor is None:
        pipeline.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {EOS}:0", special_tokens=[(EOS, pipeline.token_to_id(EOS))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=pipeline,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,  # decoding gives the text back as it was, for sacreBLEU
    )


def load_translation_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer for translation: a saved directory (`save_pretrained`) or a `tokenizers` tokenizer.json.

    A directory may hold any tokenizer with a padding token (a converted encoder-decoder's BERT tokenizer: the model's
    config then gives the start and end ids); a tokenizer.json gets our specials and must have them.

    Raises:
        UserError: nothing loadable at `path`, or no padding token.
    """
    path = Path(path)
    try:
        if path.is_dir() and any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
        elif path.is_file() and path.name.endswith(".json"):
            from tokenizers import Tokenizer as Pipeline

            tokenizer = wrap_translation_tokenizer(Pipeline.from_file(str(path)))
        elif path.is_dir():
            raise UserError(f"{path}: no tokenizer here (tokenizer.json or tokenizer_config.json)")
        else:
            raise UserError(f"{path}: tokenizer not found (a tokenizer directory or a tokenizer.json)")
    except UserError as e:
        raise UserError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    except Exception as e:  # tokenizers/transformers raise many types for malformed files
        raise UserError(f"{path}: cannot load tokenizer ({str(e).splitlines()[0] if str(e) else e!r})") from None
    if tokenizer.pad_token_id is None:
        raise UserError(f"{path}: the tokenizer has no padding token (pad_token), which batches need")
    return tokenizer


def texts_of(splits: Iterable[ParallelText]) -> Iterator[str]:
    """Every sentence of both sides of `splits`: what a joint vocabulary is trained on."""
    for split in splits:
        yield from split.sources
        yield from split.targets
