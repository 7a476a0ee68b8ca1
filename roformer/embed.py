"""Sentence embeddings: texts to vectors with any model directory's backbone (`SentenceEncoder`, `roformer embed`).

A model holds no tokenizer, so the text-level API is its own object, as sentence-transformers' `SentenceTransformer`:
`SentenceEncoder.load(DIR)` reads the model and its tokenizer, `encode(texts)` gives an (N, C) float32 array in the
texts' order. Texts are batched longest first (little padding; the biggest batch comes first, so running out of
memory shows at once) and computed on their real tokens alone (`Model.set_unpadding`); under `accelerate launch`
each process encodes a contiguous share and the main process gathers them.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from roformer.data.tokenizer import check_fits, jieba_presegmenter, load_tokenizer, segmentation, word_vocabulary
from roformer.errors import UserError
from roformer.files import atomic_write, check_output_file, read_json
from roformer.logs import quiet_loggers
from roformer.model.config import POOLINGS, ModelConfig
from roformer.model.model import Backbone, Model
from roformer.model.pretrained import load_pretrained
from roformer.tasks.base import SENTENCE_FILE, padded_length
from roformer.tasks.records import read_records, read_text, text_field
from roformer.train.evaluate import eval_chunks
from roformer.train.launch import gather, process_state

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 512
Precision = Literal["fp32", "bf16"]
VECTOR_FORMATS = (".npy", ".safetensors")
SAFETENSORS_KEY = "embeddings"  # the one tensor of an embeddings .safetensors file


def default_pooling(config: ModelConfig) -> str:
    """The pooling a model's vectors are meant to have by default.

    `pooler` for a model with a linear pooler (RoFormer-Sim: the vector it was trained to compare by cosine), else
    `mean` (Sentence-BERT's and text2vec's choice for models trained without a sentence objective).
    """
    return "pooler" if config.add_pooler and config.pooler_activation == "linear" else "mean"


class SentenceEncoder:
    """A model's backbone and its tokenizer, turning texts into vectors.

    Args:
        model: Any model (its backbone is used; a head is ignored).
        tokenizer: The model's tokenizer.
        pooling: `cls`, `mean`, `pooler` or `last` (`roformer.model.model.pool_states`); None = `default_pooling`.
        max_length: Tokens per text, [CLS] and [SEP] included (longer texts are cut); None = 512, or the learned
            position table's length.
        jieba: Segment Chinese text into words with jieba first; None = as the tokenizer says (a word-level
            vocabulary, WoBERT's or RoFormer-Chinese's, implies it); false with a word-level tokenizer is refused.
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        pooling: str | None = None,
        max_length: int | None = None,
        jieba: bool | None = None,
    ) -> None:
        config = model.config
        self.pooling = pooling or default_pooling(config)
        if self.pooling not in POOLINGS:
            raise UserError(f"pooling {self.pooling!r}: expected one of {', '.join(POOLINGS)}")
        if self.pooling == "pooler" and not config.add_pooler:
            raise UserError("pooling 'pooler': this model has no pooler (add_pooler: false); use cls, mean or last")
        limit = config.position_limit
        self.max_length = max_length or min(DEFAULT_MAX_LENGTH, limit or DEFAULT_MAX_LENGTH)
        if limit is not None and self.max_length > limit:
            raise UserError(f"max_length {self.max_length} exceeds the learned position table ({limit} positions)")
        self.model = model  # switched to eval mode and unpadding by each `encode` call alone, then set back
        self.tokenizer = tokenizer
        segmented = segmentation(tokenizer, jieba, "the sentence encoder", "jieba")
        self.segment = jieba_presegmenter(tokenizer) if segmented else None
        self.backend = self.truncating_backend(tokenizer, self.max_length)

    @staticmethod
    def truncating_backend(tokenizer: Tokenizer, max_length: int) -> Any:
        """A copy of a fast tokenizer's Rust tokenizer that truncates at `max_length` and never pads; None if slow."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        backend = copy.deepcopy(backend)  # the wrapper sets truncation and padding on its own per call
        backend.no_padding()
        backend.enable_truncation(max_length)
        return backend

    @classmethod
    def load(
        cls,
        source: str | Path,
        pooling: str | None = None,
        max_length: int | None = None,
        jieba: bool | None = None,
        device: str | torch.device = "cpu",
    ) -> SentenceEncoder:
        """The encoder of a model directory: a roformer one (`final/`, `best/`) or an HF `save_pretrained` one.

        `pooling` None: the one a similarity fine-tune recorded in the directory (`sentence.json`), else
        `default_pooling`.

        Raises:
            UserError: no model or tokenizer at `source`, a tokenizer larger than the model's vocabulary, a pooling
                the model cannot give, a word-level Chinese tokenizer with `jieba` false.
        """
        tokenizer = load_tokenizer(Path(source))
        segmentation(tokenizer, jieba, source, "jieba")  # a contradiction is refused before the weights are read
        trained = Path(source) / SENTENCE_FILE  # a similarity fine-tune's best/: the pooling it was trained with
        if pooling is None and trained.is_file():
            pooling = read_json(trained).get("pooling")
        model = load_pretrained(source, "backbone")
        check_fits(tokenizer, model.config.vocab_size, source)
        return cls(model.to(device), tokenizer, pooling, max_length, jieba)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, cut to `max_length`.

        Through the Rust tokenizer itself (a private copy, truncating at `max_length`): the ids transformers gives,
        without its per-text conversion to Python objects, which was 8% of encoding STS-B with a 4 x 256 model.
        """
        if self.segment is not None:
            texts = [self.segment(text) for text in texts]
        if self.backend is None:  # a slow (Python) tokenizer
            return self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        return [encoding.ids for encoding in self.backend.encode_batch(list(texts))]

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        normalize: bool = False,
        precision: Precision = "fp32",
        progress: bool = False,
    ) -> np.ndarray:
        """The texts' vectors, (N, C) float32, in the texts' order (unit length with `normalize`).

        The model runs in eval mode with unpadding on, and is left as the caller had it (`kept_settings`). Under
        several processes every process returns the whole array.
        """
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first
        state = process_state()
        chunks = [
            c for c in eval_chunks(len(ids), batch_size, state.process_index, state.num_processes) if c is not None
        ]
        device = next(self.model.parameters()).device
        mine: list[np.ndarray] = []
        with kept_settings(self.model):
            self.model.eval()
            self.model.set_unpadding(True)
            for chunk in progress_bar(chunks, progress and state.is_main_process):
                rows = [order[i] for i in chunk.tolist()]
                mine.append(self.encode_rows(ids, rows, device, normalize, precision))
        width = self.model.config.hidden_size
        shares = gather(np.concatenate(mine) if mine else np.zeros((0, width), np.float32))
        by_length = np.concatenate(shares)
        in_order = np.empty_like(by_length)
        in_order[order] = by_length
        return in_order

    def encode_rows(
        self, ids: list[list[int]], rows: list[int], device: torch.device, normalize: bool, precision: Precision
    ) -> np.ndarray:
        """One batch: the vectors of `rows` of `ids`, (len(rows), C) float32, in the model's current mode."""
        lengths = torch.tensor([len(ids[r]) for r in rows])
        # rounded up to 8 on accelerators (tensor cores, fused kernels); on CPU rounding only adds positions
        multiple = 1 if device.type == "cpu" else 8
        length = padded_length(int(lengths.max()), multiple, self.max_length)
        mask = torch.arange(length)[None, :] < lengths[:, None]  # (B, T)
        input_ids = torch.full(mask.shape, self.tokenizer.pad_token_id, dtype=torch.long)
        input_ids[mask] = torch.tensor([token for r in rows for token in ids[r]])  # row-major: each row's tokens
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            vectors = self.model.embed(  # token types: None is type 0 everywhere
                input_ids.to(device), mask.long().to(device), pooling=self.pooling, normalize=normalize
            )
        return vectors.float().cpu().numpy()


@contextlib.contextmanager
def kept_settings(model: torch.nn.Module) -> Iterator[None]:
    """Every module's training mode and every backbone's unpadding setting as they were before the block, after it.

    For what switches a caller's model to evaluation (`SentenceEncoder.encode`, `similar_sentences`): the caller's
    model is given back as it came, also when the block fails.
    """
    training = {module: module.training for module in model.modules()}
    unpadding = {module: module.unpadding for module in model.modules() if isinstance(module, Backbone)}
    try:
        yield
    finally:
        for module, mode in training.items():
            module.training = mode
        for module, enabled in unpadding.items():
            module.unpadding = enabled


def progress_bar(items: list, show: bool) -> Sequence:
    """`items` under a tqdm bar when `show`."""
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="embedding", unit="batch")


# ----------------------------------------------------------------------------------------------------------------
# Files in and out


def read_texts(path: str | Path, column: str | None = None) -> list[str]:
    """The texts of a file, in its order.

    A .txt file's lines (`text_lines`), or `column` (default `text`) of every row of a csv/tsv/json/jsonl/parquet
    file.

    Raises:
        UserError: a missing or unreadable file, a row without the column (naming file and line), no text at all.
    """
    path = Path(path)
    if path.suffix.lower() == ".txt":
        if column is not None:
            raise UserError(f"{path}: a .txt file has one text per line and no columns (drop --column)")
        texts = text_lines(path)
    else:
        texts = [text_field(record, column or "text") for record in read_records(path)]
    if not texts:
        raise UserError(f"{path}: no texts to embed")
    return texts


def text_lines(path: Path) -> list[str]:
    r"""The lines of a UTF-8 text file, split at `\n` alone (a `\r` before it dropped), so that line i is text i.

    A newline ends a line: the one at the end of the file adds no empty text, an empty line between two others is an
    empty text. Nothing else breaks a line, neither a lone `\r` nor what `str.splitlines` also splits at (form feed,
    U+2028, U+0085, `\x1c`...): those are characters of the text.

    Raises:
        UserError: a missing, unreadable or non-UTF-8 file, naming it.
    """
    lines = read_text(path, line_ends_as_written=True).split("\n")  # a lone \r is no line end
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line (or an empty file)
    return [line.removesuffix("\r") for line in lines]


def check_vectors_path(path: str | Path, overwrite: bool) -> Path:
    """The output path, checked before any work: a known format, and no file replaced unless `overwrite`.

    Raises:
        UserError: an unknown suffix, or an existing file without `overwrite`.
    """
    path = Path(path)
    if path.suffix.lower() not in VECTOR_FORMATS:
        raise UserError(f"{path}: expected a .npy or .safetensors file for the vectors")
    if path.exists() and not overwrite:
        raise UserError(f"{path}: exists (pass --overwrite to replace it)")
    check_output_file(path)
    return path


def write_vectors(path: str | Path, vectors: np.ndarray) -> None:
    """Write the (N, C) vectors all or nothing: .npy (numpy.load) or .safetensors (one tensor, `embeddings`).

    The file's folder is made if missing (by `atomic_write`; `check_vectors_path` has checked that it can be).

    Raises:
        WriteFailed: the disk is full or read-only (exit code 74), naming `path`.
        UserError: any other failure to make the folder or write the file (a file where the folder goes, no
            permission), naming `path`; nothing that was there is changed.
    """
    path = Path(path)
    try:
        atomic_write(path, vector_writer(path, vectors))
    except OSError as e:
        reason = e.strerror or str(e)
        try:
            check_output_file(path)  # a file in the folder's place, or a folder that cannot be written: said so
        except UserError as obstacle:
            reason = str(obstacle)
        raise UserError(f"cannot write {path}: {reason}") from None


def vector_writer(path: Path, vectors: np.ndarray) -> Callable[[Path], None]:
    """What writes `vectors` in `path`'s format to a given (temporary) file."""
    if path.suffix.lower() == ".npy":

        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:  # np.save(path) would add .npy to the temporary name
                np.save(f, vectors)

    else:
        from safetensors.numpy import save_file

        def write(tmp: Path) -> None:
            save_file({SAFETENSORS_KEY: np.ascontiguousarray(vectors)}, str(tmp))

    return write


def read_vectors(path: str | Path) -> np.ndarray:
    """Vectors written by `write_vectors` (or `roformer embed`)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        return np.load(path)
    from safetensors.numpy import load_file

    return load_file(str(path))[SAFETENSORS_KEY]


# ----------------------------------------------------------------------------------------------------------------
# Export to sentence-transformers

ST_POOLING_MODES = {"cls": "cls", "mean": "mean", "last": "lasttoken", "pooler": "cls"}  # ours -> ST's Pooling


def sentence_transformers_modules() -> Any:
    """sentence-transformers' module classes (Transformer, Pooling, Dense, Normalize), from where this version has them.

    Raises:
        UserError: the package is not installed.
    """
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        raise UserError(
            "the sentence-transformers export needs the sentence-transformers package: "
            "pip install 'roformer-pytorch[sentence-transformers]'"
        ) from None
    try:  # 6.x; `sentence_transformers.models` before (still there in 6.x, deprecated)
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


def check_exportable(tokenizer: Tokenizer, where: str | Path) -> None:
    """Refuse a word-level Chinese tokenizer for sentence-transformers, which cannot segment texts with jieba first.

    Raises:
        UserError: naming `where` (the model folder) and what can be done instead.
    """
    if word_vocabulary(tokenizer) is not None:
        raise UserError(
            f"{where}: a word-level Chinese model (its tokenizer reads jieba's words) cannot be exported to "
            "sentence-transformers, which does not segment texts with jieba; embed them with roformer embed "
            "(in Python SentenceEncoder.load) instead, which does"
        )


def without_pooler(model: Model) -> Model:
    """The backbone of `model` without its pooler, the same weights otherwise.

    HF's RoFormerModel has no pooler, so a pooler is exported as a sentence-transformers Dense layer instead.
    """
    backbone = model.base_model
    plain = Backbone(replace(backbone.config, add_pooler=False), init=False)
    plain.load_state_dict({k: v for k, v in backbone.state_dict().items() if not k.startswith("pooler.")})
    return plain.eval()


def export_sentence_transformers(encoder: SentenceEncoder, out: str | Path, normalize: bool, overwrite: bool) -> Path:
    """Write `encoder` as a folder that `SentenceTransformer(out)` loads without remote code.

    The folder: the backbone as a transformers model (`roformer.to_hf`: RoFormerModel for rotary, BertModel
    otherwise) with the tokenizer, a Pooling module (cls, mean or lasttoken), for `pooler` pooling a Dense module
    holding the pooler's weights on the [CLS] state (tanh for BERT's pooler, the identity for RoFormer-Sim's linear
    one), and a Normalize module if asked. Its vectors equal `encoder.encode`'s.

    Raises:
        UserError: sentence-transformers is not installed, a word-level Chinese tokenizer (`check_exportable`),
            or transformers cannot hold the model (RoFormerV2, relative position encodings: `to_hf`'s one-line
            error).
    """
    import tempfile

    import torch.nn as nn
    from sentence_transformers import SentenceTransformer

    from roformer.files import staged_output_dir
    from roformer.model.hf import to_hf

    modules = sentence_transformers_modules()
    check_exportable(encoder.tokenizer, "the encoder's model")
    config = encoder.model.config
    hf_model = to_hf(without_pooler(encoder.model))  # before anything is written: it refuses what HF cannot hold
    out = Path(out)
    with staged_output_dir(out, overwrite) as staging, tempfile.TemporaryDirectory() as tmp, hidden_progress_bars():
        hf_model.save_pretrained(tmp)
        encoder.tokenizer.save_pretrained(tmp)
        transformer = modules.Transformer(tmp, max_seq_length=exported_length(encoder))
        parts = [transformer, modules.Pooling(config.hidden_size, pooling_mode=ST_POOLING_MODES[encoder.pooling])]
        if encoder.pooling == "pooler":
            pooler = encoder.model.base_model.pooler
            tanh = config.pooler_activation == "tanh"
            activation = nn.Tanh() if tanh else nn.Identity()
            width = config.hidden_size
            dense = modules.Dense(width, width, bias=pooler.bias is not None, activation_function=activation)
            dense.linear.load_state_dict(pooler.state_dict())
            parts.append(dense)
        if normalize:
            parts.append(modules.Normalize())
        with quiet_loggers("sentence_transformers"):  # it names the hidden staging folder
            SentenceTransformer(modules=parts, device="cpu").save(str(staging))
    return out


def exported_length(encoder: SentenceEncoder) -> int:
    """The encoder's max length, within the position table that transformers builds.

    `max_position_embeddings` rows, for RoFormer's rotary angles and BERT's positions alike: ours computes rotary
    angles for any length, HF's cannot.
    """
    limit = encoder.model.config.max_position_embeddings
    if encoder.max_length > limit:
        logger.warning("max length %d cut to %d: transformers' position table ends there", encoder.max_length, limit)
    return min(encoder.max_length, limit)


@contextlib.contextmanager
def hidden_progress_bars() -> Iterator[None]:
    """The progress bars of transformers (shards written and read) off for a block."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


# ----------------------------------------------------------------------------------------------------------------
# RoFormer-Sim: paraphrases generated, then ranked by the vectors' cosine

_CJK_GAP = re.compile(r"(?<=[\u3000-\u30ff\u3400-\u9fff\uff00-\uffef]) (?=[\u3000-\u30ff\u3400-\u9fff\uff00-\uffef])")


def joined_text(pieces: str) -> str:
    """A decoded WordPiece text with the spaces between CJK characters removed (decoding puts one between any two)."""
    return _CJK_GAP.sub("", pieces).strip()


def similar_sentences(
    model: Model,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    n: int = 8,
    max_new_tokens: int = 32,
    top_p: float = 0.95,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[list[tuple[str, float]]]:
    """RoFormer-Sim's use: `n` paraphrases of every text sampled in one batch, ranked by similarity to the text.

    Generation is Sim's UniLM decoding (`CausalLM.generate`: the text is segment A and sees itself in both
    directions, the new tokens are segment B and see the text and what came before them), sampled with nucleus
    sampling until [SEP]. Each text's distinct candidates (the text itself and empty ones left out) are then scored by
    the cosine of their pooled vectors with the text's (the pooler for a model that has one, as Sim's similarity
    is trained; else the mean), the same model encoding both.

    Args:
        model: A `CausalLM` with `attention_pattern: unilm` (RoFormer-Sim), or any causal model.
        tokenizer: Its tokenizer.
        texts: The texts to paraphrase.
        n: Samples drawn per text (fewer candidates remain where samples repeat).
        max_new_tokens: The longest paraphrase, in tokens.
        top_p: Nucleus sampling's probability mass.
        temperature: Sampling temperature.
        generator: Random numbers for the draws (reproducible paraphrases).

    Returns:
        For every text, its candidates and their cosines, most similar first.
    """
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    with kept_settings(model):  # eval mode for sampling and scoring, then the caller's mode back
        model.eval()
        device = next(model.parameters()).device
        prompts = [ids for ids in tokenizer(list(texts))["input_ids"] for _ in range(n)]
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):  # left-padded: every prompt ends where generation starts
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "generator": generator}
        with torch.inference_mode():  # every new token is segment B (type 1) under UniLM attention: generate's rule
            types = torch.zeros_like(input_ids).to(device)
            out = model.generate(
                input_ids.to(device),
                mask.to(device),
                types,
                max_new_tokens,
                eos_token_id=tokenizer.sep_token_id,
                **sampling,
            )
        decoded = [joined_text(t) for t in tokenizer.batch_decode(out[:, width:].tolist(), skip_special_tokens=True)]
        pooling = "pooler" if model.config.add_pooler else "mean"
        encoder = SentenceEncoder(model, tokenizer, pooling=pooling)
        ranked = []
        for i, text in enumerate(texts):
            candidates = [c for c in dict.fromkeys(decoded[i * n : (i + 1) * n]) if c and c != joined_text(text)]
            if not candidates:
                ranked.append([])
                continue
            vectors = encoder.encode([text, *candidates], normalize=True)
            scores = vectors[1:] @ vectors[0]
            ranked.append(sorted(zip(candidates, scores.tolist()), key=lambda pair: -pair[1]))
        return ranked
