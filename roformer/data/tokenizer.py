"""WordPiece tokenizers: train one on the training text, or load one (tokenizer.json, a model dir, a vocab.txt).

A trained tokenizer is a BERT tokenizer: BERT normalisation (optional lower-casing), BERT pre-tokenisation,
WordPiece with `##` continuations, and the `[CLS] A [SEP] B [SEP]` template with token types. It is saved with
`save_pretrained` (loadable by `transformers.AutoTokenizer`) plus a `vocab.txt`, so HF BERT/RoFormer tools read it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from roformer.data.config import DataConfig
from roformer.errors import UserError

if TYPE_CHECKING:  # transformers and tokenizers are imported where a tokenizer is built (import time of the CLI)
    from tokenizers import Tokenizer as Pipeline
    from transformers import PreTrainedTokenizerFast

# Every tokenizer the project trains or loads: a transformers fast tokenizer around a `tokenizers` pipeline.
Tokenizer: TypeAlias = "PreTrainedTokenizerFast"

SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2, split_cjk: bool = True
) -> Tokenizer:
    """Train a BERT WordPiece tokenizer on `texts`.

    `split_cjk=False` keeps runs of CJK characters together (for text pre-segmented into words by jieba);
    BERT's normaliser would otherwise isolate every CJK character and the vocabulary would be character-level.

    Returns:
        A `transformers` fast tokenizer with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
    """
    from tokenizers import trainers

    texts = list(texts)
    tok = _bert_wordpiece(None, lowercase, split_cjk)
    specials = list(SPECIAL_TOKENS.values())
    # The trainer numbers `##c` continuation pieces in hash-map order and breaks equal-count merges by id, so the same
    # text could give two vocabularies (huggingface/tokenizers#1794). Declaring every continuation piece up front, in
    # sorted order, fixes their ids and with them every tie. They become plain vocabulary entries below.
    continuations = sorted(_continuation_pieces(tok, texts))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials + continuations,
        show_progress=sys.stderr.isatty(),  # its bar is blank lines on a log file or a pipe
    )
    tok.train_from_iterator(texts, trainer)
    # Number canonically (special tokens first, then by string): the ids do not depend on the trainer's internals.
    rest = sorted(set(tok.get_vocab()) - set(specials))
    vocab = {token: index for index, token in enumerate(specials + rest)}
    return wrap_tokenizer(_bert_wordpiece(vocab, lowercase, split_cjk), lowercase)


def _continuation_pieces(tok: Pipeline, texts: list[str]) -> set[str]:
    """The `##c` pieces the trainer starts from: every character that occurs after the first in a pre-token."""
    chars: set[str] = set()
    for text in texts:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            chars.update(word[1:])
    return {f"##{c}" for c in chars}


def _bert_wordpiece(vocab: dict[str, int] | None, lowercase: bool, split_cjk: bool = True) -> Pipeline:
    """A `tokenizers` BERT pipeline around a WordPiece model (untrained when vocab is None)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.normalizer = normalizers.BertNormalizer(
        lowercase=lowercase, strip_accents=None if lowercase else False, handle_chinese_chars=split_cjk
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def wrap_tokenizer(tok: Pipeline, lowercase: bool) -> Tokenizer:
    """Add the [CLS] A [SEP] B [SEP] template and wrap as a transformers fast tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    cls, sep = SPECIAL_TOKENS["cls_token"], SPECIAL_TOKENS["sep_token"]
    if tok.token_to_id(cls) is None or tok.token_to_id(sep) is None:
        raise UserError(f"tokenizer vocabulary has no {cls} / {sep}")
    if tok.post_processor is None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=lowercase,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **SPECIAL_TOKENS,
    )


VOCAB_SUFFIXES = (".txt", ".vocab", "")  # BERT's vocab.txt and its renamings (vocab_chinese.txt, bert.vocab)


def load_tokenizer(path: str | Path, lowercase: bool = True, split_cjk: bool = True) -> Tokenizer:
    """Load a tokenizer: a directory (`save_pretrained` layout or a `vocab.txt`), a tokenizer.json or a vocab.txt.

    `split_cjk=False` turns off the BERT normaliser's splitting of CJK characters (jieba-segmented text, WoBERT's
    word-level vocab.txt); `lowercase` applies to a bare vocab.txt.

    Raises:
        UserError: nothing usable at `path`, or no [MASK] token.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    try:
        if path.is_dir():
            if not any((path / name).is_file() for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json")):
                raise UserError(f"{path}: the directory has no tokenizer files (tokenizer.json or vocab.txt)")
            word_level = word_level_tokenizer(path)
            if word_level is not None:
                tokenizer = word_level
            elif (path / "tokenizer.json").is_file() or _loads_without_rjieba(path):
                tokenizer = AutoTokenizer.from_pretrained(str(path))
            else:  # a bare vocab.txt, or HF's RoFormer tokenizer (it needs rjieba): BERT's WordPiece of the vocab.txt
                tokenizer = _from_vocab(path / "vocab.txt", _lowercases(path, lowercase))
        elif path.name.endswith(".json") and path.is_file():
            from tokenizers import Tokenizer

            tokenizer = wrap_tokenizer(Tokenizer.from_file(str(path)), lowercase)
        elif path.is_file() and path.suffix.lower() in VOCAB_SUFFIXES:
            tokenizer = _from_vocab(path, lowercase)
        elif path.is_file():  # a config, weights, a script: reading it as a vocabulary would give nonsense errors
            raise UserError(
                f"{path}: not a tokenizer (expected a tokenizer directory, a tokenizer.json or a vocab.txt, got a "
                f"{path.suffix or 'suffix-less'} file)"
            )
        else:
            raise UserError(f"{path}: tokenizer not found")
    except UserError as e:
        if str(path) in str(e):
            raise
        raise UserError(f"{path}: {e}") from None  # every tokenizer error names the file it read
    except Exception as e:  # tokenizers/transformers raise many types for malformed files
        raise UserError(f"{path}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise UserError(f"{path}: tokenizer has no [MASK] or [PAD] token, needed for MLM")
    if not split_cjk:
        keep_cjk_words(tokenizer)
    return tokenizer


# A vocabulary is word-level Chinese when at least this share of it is words of several CJK characters: about two
# thirds of WoBERT's and RoFormer-Chinese's 50k, hardly any of a character-level one's (bert-base-chinese)
WORD_SHARE = 0.05


def word_level_vocab(vocab_file: Path) -> bool:
    """Whether a vocab.txt is a word-level Chinese one (WoBERT, RoFormer-Chinese: read after jieba).

    Decided from the vocabulary itself. The checkpoints' `tokenizer_class` cannot tell: JunnYu's character-level
    RoFormer checkpoints (RoFormer-Sim-char, V2) name `RoFormerTokenizer` as the word-level ones do, and his WoBERT
    ones name no class at all (transformers then loads them as plain BERT, cutting every word into characters).
    """
    tokens = [t.rstrip("\r") for t in vocab_file.read_text(encoding="utf-8").split("\n") if t.strip()]
    words = sum(len(t) > 1 and all(is_cjk(c) for c in t) for t in tokens)
    return bool(tokens) and words >= WORD_SHARE * len(tokens)


def word_level_tokenizer(source: str | Path) -> Tokenizer | None:
    """Our word-level tokenizer of a word-level Chinese checkpoint (a directory or a hub name), else None.

    The checkpoint's vocab.txt as WordPiece with CJK words kept whole (the caller pre-segments with jieba: WoBERT's and
    RoFormer's tokenization). None for a character-level vocabulary, for a directory whose tokenizer.json keeps CJK
    words whole already (ours: it is loaded as saved), and for a hub name whose files cannot be downloaded.
    """
    directory = Path(source)
    if not directory.is_dir():
        try:
            from huggingface_hub import snapshot_download

            patterns = ["vocab.txt", "tokenizer_config.json"]
            directory = Path(snapshot_download(str(source), allow_patterns=patterns))
        except Exception:  # offline, no such repository: the caller's generic path reports it
            return None
    vocab_file = directory / "vocab.txt"
    if not vocab_file.is_file() or _keeps_cjk_words(directory / "tokenizer.json") or not word_level_vocab(vocab_file):
        return None
    tokenizer = _from_vocab(vocab_file, _lowercases(directory, True))
    keep_cjk_words(tokenizer)
    return tokenizer


def _keeps_cjk_words(tokenizer_json: Path) -> bool:
    """Whether a tokenizer.json's BERT normaliser leaves CJK characters together (a word-level tokenizer as saved)."""
    try:
        normalizer = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("normalizer") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return normalizer.get("type") == "BertNormalizer" and normalizer.get("handle_chinese_chars") is False


def _loads_without_rjieba(directory: Path) -> bool:
    """A tokenizer_config.json that transformers loads here: any class but its RoFormer tokenizer (needs rjieba)."""
    try:
        settings = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return not (isinstance(settings, dict) and str(settings.get("tokenizer_class", "")).startswith("RoFormerTokenizer"))


def _lowercases(directory: Path, default: bool) -> bool:
    """The `do_lower_case` of a checkpoint's tokenizer_config.json (`default` without one)."""
    try:
        settings = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        return bool(settings.get("do_lower_case", default))
    except (OSError, ValueError, AttributeError):
        return default


def segmentation(tokenizer: Tokenizer, jieba: bool | None, where: str | Path, option: str = "data.jieba") -> bool:
    """Whether texts are cut into jieba's words before `tokenizer`: what its vocabulary says, unless told.

    A word-level tokenizer (WoBERT, RoFormer-Chinese: `word_vocabulary`) reads jieba's words: without them a Chinese
    sentence would reach its WordPiece as one word (and come out [UNK]), so it implies jieba. Any other tokenizer
    reads the text as it is, unless `jieba` is true.

    Args:
        tokenizer: The tokenizer that reads the texts.
        jieba: The setting: None follows the tokenizer; true or false says so.
        where: What is named in the error (the model folder).
        option: The setting's name in the error (`data.jieba`, `--jieba`).

    Raises:
        UserError: `jieba` false with a word-level tokenizer (a contradiction), naming `where`.
    """
    word_level = word_vocabulary(tokenizer) is not None
    if jieba is False and word_level:
        raise UserError(
            f"{where}: the tokenizer is word-level Chinese (WoBERT-style: jieba's words, then WordPiece), but "
            f"{option} is false: remove it (a word-level tokenizer implies jieba)"
        )
    return word_level or bool(jieba)


def keep_cjk_words(tokenizer: Tokenizer) -> None:
    """Stop a BERT normaliser from isolating CJK characters (in place), so jieba's words reach WordPiece whole."""
    from tokenizers import normalizers

    normalizer = tokenizer.backend_tokenizer.normalizer
    if isinstance(normalizer, normalizers.BertNormalizer):
        normalizer.handle_chinese_chars = False
    if "tokenize_chinese_chars" in tokenizer.init_kwargs:  # BertTokenizerFast re-applies it when reloaded
        tokenizer.init_kwargs["tokenize_chinese_chars"] = False


def _from_vocab(vocab_file: Path, lowercase: bool) -> Tokenizer:
    """A WordPiece tokenizer from BERT's vocab.txt: token i is line i (lines end at a newline only, as BERT reads them).

    Raises:
        UserError: a token on two lines (its ids would not be 0..n-1, and a model sized to the vocabulary would
            index past its embeddings).
    """
    lines = vocab_file.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    vocab: dict[str, int] = {}
    for index, line in enumerate(line.rstrip("\r") for line in lines):
        if line in vocab:
            raise UserError(f"{vocab_file}:{index + 1}: token {line!r} is also on line {vocab[line] + 1}")
        vocab[line] = index
    return wrap_tokenizer(_bert_wordpiece(vocab, lowercase), lowercase)


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> None:
    """`save_pretrained` plus a `vocab.txt` (one token per line, in id order) for tools that expect BERT's file."""
    directory = Path(directory)
    tokenizer.save_pretrained(str(directory))
    vocab = tokenizer.get_vocab()
    ordered = sorted(vocab, key=vocab.__getitem__)
    (directory / "vocab.txt").write_text("".join(token + "\n" for token in ordered), encoding="utf-8")


def vocab_hash(tokenizer: Tokenizer) -> str:
    """A short sha256 of the vocabulary (every token in id order): equal hashes, equal token ids."""
    vocab = tokenizer.get_vocab()
    ordered = "\n".join(sorted(vocab, key=vocab.__getitem__))
    return hashlib.sha256(ordered.encode("utf-8")).hexdigest()[:16]


def tokenizer_to_json(tokenizer: Tokenizer) -> str:
    """The whole tokenizer pipeline as one JSON string (to hand a trained tokenizer to other processes)."""
    return tokenizer.backend_tokenizer.to_str()


def tokenizer_from_json(text: str, lowercase: bool = True) -> Tokenizer:
    """The tokenizer that `tokenizer_to_json` wrote, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer

    return wrap_tokenizer(Tokenizer.from_str(text), lowercase)


def jieba_presegmenter(tokenizer: Tokenizer | None = None) -> Callable[[str], str]:
    """WoBERT-style word-level pre-segmentation of Chinese text with jieba (words joined by spaces).

    With the `tokenizer` that will read the text, a word outside its vocabulary is spelled out in characters, as
    WoBERT's and RoFormer's tokenizers do (bert4keras's `Tokenizer` with jieba `pre_tokenize`: a jieba word in the
    vocabulary is one token, any other is tokenized the plain BERT way, a CJK character at a time), instead of being
    cut by WordPiece into a prefix word and `##` pieces. Without one (training a vocabulary), words stay whole.

    Raises:
        UserError: jieba is not installed.
    """
    _jieba_tokenize()  # jieba imported now: a missing package is an error before any data work
    vocab = word_vocabulary(tokenizer)
    if vocab is None:
        return lambda text: " ".join(word for word, _, _ in jieba_words(text))
    return lambda text: " ".join(piece for piece, _, _ in spelled_out(jieba_words(text), vocab))


def word_vocabulary(tokenizer: Tokenizer | None) -> WordVocabulary | None:
    """The words a word-level tokenizer keeps whole, or None for any other tokenizer.

    A character-level Chinese tokenizer isolates every CJK character itself, so no word outside its vocabulary
    reaches WordPiece whole.
    """
    from tokenizers import normalizers

    if tokenizer is None:
        return None
    normalizer = tokenizer.backend_tokenizer.normalizer
    if not isinstance(normalizer, normalizers.BertNormalizer) or normalizer.handle_chinese_chars:
        return None
    return WordVocabulary(frozenset(tokenizer.get_vocab()), bool(normalizer.lowercase))


@dataclass(frozen=True)
class WordVocabulary:
    """A word-level tokenizer's vocabulary, as jieba's words are looked up in it."""

    tokens: frozenset[str]
    lowercase: bool

    def __contains__(self, word: str) -> bool:
        return (word.lower() if self.lowercase else word) in self.tokens


@cache
def _jieba_tokenize() -> Callable[[str], list[tuple[str, int, int]]]:
    try:
        import jieba
    except ImportError:
        raise UserError("data.jieba: true needs the jieba package (pip install jieba)") from None
    jieba.setLogLevel(60)  # its dictionary-loading messages
    # HMM off: the words of roformer.data.tokenizer.jieba_presegmenter, which word-level pretraining used
    return lambda text: list(jieba.tokenize(text, HMM=False))


def jieba_words(text: str) -> list[tuple[str, int, int]]:
    """The words jieba cuts `text` into, with their character spans `(word, start, end)`: together, the text."""
    return _jieba_tokenize()(text)


def spelled_out(words: list[tuple[str, int, int]], vocab: WordVocabulary) -> list[tuple[str, int, int]]:
    """The `(word, start, end)` of jieba with every word outside `vocab` spelled out, spans kept exact.

    Such a word becomes each of its CJK characters alone and each run of its other characters together (BERT's basic
    tokenization reads those).
    """
    out = []
    for word, start, end in words:
        if word in vocab or len(word) == 1:
            out.append((word, start, end))
            continue
        run = 0  # start of the current run of non-CJK characters within the word
        for i, char in enumerate(word):
            if is_cjk(char):
                if run < i:
                    out.append((word[run:i], start + run, start + i))
                out.append((char, start + i, start + i + 1))
                run = i + 1
        if run < len(word):
            out.append((word[run:], start + run, end))
    return out


def is_cjk(char: str) -> bool:
    """A CJK ideograph, as BERT's basic tokenizer isolates them (the CJK Unified Ideographs blocks and extensions)."""
    code = ord(char)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2A6DF
        or 0x2A700 <= code <= 0x2B73F
        or 0x2B740 <= code <= 0x2B81F
        or 0x2B820 <= code <= 0x2CEAF
        or 0xF900 <= code <= 0xFAFF
        or 0x2F800 <= code <= 0x2FA1F
    )


# Files that make up an HF tokenizer; copied along with a model so that the directory stays self-contained.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "added_tokens.json",
)


def copy_tokenizer_files(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer files present in `source` to `target`; returns the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
            copied.append(name)
    return copied


def make_tokenizer(
    config: DataConfig,
    base: Path | None,
    texts: Iterable[str],
    transform: Callable[[str], str] | None,
    given: Tokenizer | None = None,
) -> Tokenizer:
    """The tokenizer `given` (another process's), else the configured one loaded, else one trained on `texts`."""
    if given is not None:
        return given
    if config.tokenizer:
        path = Path(config.tokenizer)
        path = path if path.is_absolute() or base is None else base / path
        return load_tokenizer(path, config.lowercase, split_cjk=not config.jieba)
    if transform is not None:
        texts = (transform(t) for t in texts)
    return train_tokenizer(texts, config.vocab_size, config.lowercase, split_cjk=not config.jieba)


def check_fits(tokenizer: Tokenizer, vocab_size: int, where: str | Path) -> None:
    """The tokenizer's ids must all be rows of the model's embedding (a tokenizer copied from another run may not).

    Raises:
        UserError: naming `where` (the model directory), both sizes.
    """
    if len(tokenizer) > vocab_size:
        raise UserError(
            f"{where}: the tokenizer has {len(tokenizer)} ids but the model's vocabulary {vocab_size} "
            "(a tokenizer from another model?)"
        )
