"""Sentence embeddings: texts to vectors with any model directory's backbone (`SentenceEncoder`, `roformer embed`).

A model holds no tokenizer, so the text-level API is its own object, as sentence-transformers' `SentenceTransformer`:
`SentenceEncoder.load(DIR)` reads the model and its tokenizer, `encode(texts)` gives an (N, C) float32 array in the
texts' order. Texts are batched longest first (little padding; the biggest batch comes first, so running out of
memory shows at once) and computed on their real tokens alone (`Model.set_unpadding`); under `accelerate launch`
each process encodes a contiguous share and the main process gathers them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from roformer.data.records import read_records, read_text, text_field
from roformer.data.tasks import pad_rows, padded_length
from roformer.data.tokenizer import check_fits, jieba_presegmenter, load_tokenizer
from roformer.errors import UserError
from roformer.files import atomic_write
from roformer.model.config import ModelConfig
from roformer.model.model import POOLINGS, Model
from roformer.model.pretrained import load_pretrained
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
        jieba: Segment Chinese text into words with jieba first (word-level models: WoBERT, RoFormer char/word).
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        pooling: str | None = None,
        max_length: int | None = None,
        jieba: bool = False,
    ) -> None:
        config = model.config
        self.pooling = pooling or default_pooling(config)
        if self.pooling not in POOLINGS:
            raise UserError(f"pooling {self.pooling!r}: expected one of {', '.join(POOLINGS)}")
        if self.pooling == "pooler" and not config.add_pooler:
            raise UserError("pooling 'pooler': this model has no pooler (add_pooler: false); use cls, mean or last")
        limit = config.max_position_embeddings if config.position_encoding == "learned" else None
        self.max_length = max_length or min(DEFAULT_MAX_LENGTH, limit or DEFAULT_MAX_LENGTH)
        if limit is not None and self.max_length > limit:
            raise UserError(f"max_length {self.max_length} exceeds the learned position table ({limit} positions)")
        self.model = model.eval()
        self.model.set_unpadding(True)
        self.tokenizer = tokenizer
        self.segment = jieba_presegmenter() if jieba else None

    @classmethod
    def load(
        cls,
        source: str | Path,
        pooling: str | None = None,
        max_length: int | None = None,
        jieba: bool = False,
        device: str | torch.device = "cpu",
    ) -> SentenceEncoder:
        """The encoder of a model directory: a roformer one (`final/`, `best/`) or an HF `save_pretrained` one.

        Raises:
            UserError: no model or tokenizer at `source`, a tokenizer larger than the model's vocabulary, a pooling
                the model cannot give.
        """
        tokenizer = load_tokenizer(Path(source))
        model = load_pretrained(source, "backbone")
        check_fits(tokenizer, model.config.vocab_size, source)
        return cls(model.to(device), tokenizer, pooling, max_length, jieba)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, cut to `max_length`."""
        if self.segment is not None:
            texts = [self.segment(text) for text in texts]
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        return encoded["input_ids"]

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        normalize: bool = False,
        precision: Precision = "fp32",
        progress: bool = False,
    ) -> np.ndarray:
        """The texts' vectors, (N, C) float32, in the texts' order (unit length with `normalize`).

        Under several processes every process returns the whole array.
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
        for chunk in progress_bar(chunks, progress and state.is_main_process):
            rows = [order[i] for i in chunk.tolist()]
            vectors = self.encode_rows(ids, rows, device, normalize, precision)
            mine.append(vectors)
        width = self.model.config.hidden_size
        shares = gather(np.concatenate(mine) if mine else np.zeros((0, width), np.float32))
        by_length = np.concatenate(shares)
        in_order = np.empty_like(by_length)
        in_order[order] = by_length
        return in_order

    def encode_rows(
        self, ids: list[list[int]], rows: list[int], device: torch.device, normalize: bool, precision: Precision
    ) -> np.ndarray:
        """One batch: the vectors of `rows` of `ids`, (len(rows), C) float32."""
        length = padded_length(max(len(ids[r]) for r in rows), 8, self.max_length)
        batch = pad_rows(ids, [[0] * len(row) for row in ids], rows, self.tokenizer.pad_token_id, length)
        batch = {k: v.to(device) for k, v in batch.items()}
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            vectors = self.model.embed(**batch, pooling=self.pooling, normalize=normalize)
        return vectors.float().cpu().numpy()


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

    A .txt file's lines, or `column` (default `text`) of every row of a csv/tsv/json/jsonl/parquet file.

    Raises:
        UserError: a missing or unreadable file, a row without the column (naming file and line), no text at all.
    """
    path = Path(path)
    if path.suffix.lower() == ".txt":
        if column is not None:
            raise UserError(f"{path}: a .txt file has one text per line and no columns (drop --column)")
        texts = read_text(path).splitlines()
    else:
        texts = [text_field(record, column or "text") for record in read_records(path)]
    if not texts:
        raise UserError(f"{path}: no texts to embed")
    return texts


def check_vectors_path(path: str | Path, overwrite: bool) -> Path:
    """The output path, checked before any work: a known format, and no file replaced unless `overwrite`.

    Raises:
        UserError: an unknown suffix, or an existing file without `overwrite`.
    """
    from roformer.files import check_output_file

    path = Path(path)
    if path.suffix.lower() not in VECTOR_FORMATS:
        raise UserError(f"{path}: expected a .npy or .safetensors file for the vectors")
    if path.exists() and not overwrite:
        raise UserError(f"{path}: exists (pass --overwrite to replace it)")
    check_output_file(path)
    return path


def write_vectors(path: str | Path, vectors: np.ndarray) -> None:
    """Write the (N, C) vectors all or nothing: .npy (numpy.load) or .safetensors (one tensor, `embeddings`)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":

        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:  # np.save(path) would add .npy to the temporary name
                np.save(f, vectors)

    else:
        from safetensors.numpy import save_file

        def write(tmp: Path) -> None:
            save_file({SAFETENSORS_KEY: np.ascontiguousarray(vectors)}, str(tmp))

    atomic_write(path, write)


def read_vectors(path: str | Path) -> np.ndarray:
    """Vectors written by `write_vectors` (or `roformer embed`)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        return np.load(path)
    from safetensors.numpy import load_file

    return load_file(str(path))[SAFETENSORS_KEY]
