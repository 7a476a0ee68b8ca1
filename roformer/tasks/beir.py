"""A retrieval data set in the BEIR layout, read and checked: the corpus, the queries and their relevance judgments.

The folder (`data.beir_dir`) holds, as BEIR (Thakur et al. 2021) and MTEB distribute their sets:

    corpus.jsonl        {"_id": ..., "title": ..., "text": ...} per document (the title may be empty or absent)
    queries.jsonl       {"_id": ..., "text": ...} per query
    qrels/train.tsv     query-id <tab> corpus-id <tab> score, after a header line; also dev.tsv and test.tsv

A judgment with score > 0 marks a relevant document of that grade (graded nDCG reads the grade, the other metrics
only that it is relevant); a score of 0 or below marks a judged non-relevant one (the retrieval type's hard
negatives). A document is read as its title and text joined by a space, as sentence-transformers' BEIR examples
do. Every problem is an error naming the file and line: a missing file, a line that is not JSON, an id that is not a
string or an integer, an id given twice, a judgment of an unknown query or document, a score that is not an integer,
the same query and document judged twice (pytrec_eval and sentence-transformers key judgments by both), a test split
that judges nothing relevant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from roformer.data.text import is_integer_text, json_lines
from roformer.errors import UserError
from roformer.tasks.records import read_text

SPLITS = ("train", "dev", "test")
QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclass
class Beir:
    """A BEIR folder's contents.

    Attributes:
        corpus: {document id: its title and text}, in file order.
        queries: {query id: its text}, in file order.
        qrels: {split: {query id: {document id: score}}}, the splits whose qrels file exists, queries in file order.
    """

    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, dict[str, int]]]

    def relevant(self, split: str, query: str) -> dict[str, int]:
        """The documents judged relevant (score > 0) to `query` in `split`, with their grades."""
        return {doc: score for doc, score in self.qrels[split][query].items() if score > 0}

    def judged_queries(self, split: str) -> list[str]:
        """The queries of `split` with at least one relevant document, in qrels order (the ones scored)."""
        return [q for q, judged in self.qrels[split].items() if any(s > 0 for s in judged.values())]


def read_beir(folder: Path) -> Beir:
    """The corpus, queries and every qrels split of a BEIR folder.

    Raises:
        UserError: a missing folder or file, or a bad line, naming the file and line.
    """
    if not folder.is_dir():
        raise UserError(f"{folder}: no BEIR folder here (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    corpus = _records(folder / "corpus.jsonl", document=True)
    queries = _records(folder / "queries.jsonl", document=False)
    qrels = {
        split: _qrels(folder / "qrels" / f"{split}.tsv", queries, corpus)
        for split in SPLITS
        if (folder / "qrels" / f"{split}.tsv").is_file()
    }
    beir = Beir(corpus, queries, qrels)
    if "test" in qrels and not beir.judged_queries("test"):  # a split to score with nothing to score it by
        path = folder / "qrels" / "test.tsv"
        raise UserError(f"{path}: judges no document relevant (every score is 0 or below), so no query can be scored")
    return beir


def _records(path: Path, document: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, record in json_lines(path, read_text(path)):
        where = f"{path}:{number}"
        if not isinstance(record, dict) or "_id" not in record or not isinstance(record.get("text"), str):
            raise UserError(f"{where}: expected an object with `_id` and a `text` string")
        if isinstance(record["_id"], bool) or not isinstance(record["_id"], (str, int)):
            raise UserError(f"{where}: `_id` must be a string or an integer, got {json.dumps(record['_id'])}")
        key = str(record["_id"])
        if not key or any(c.isspace() for c in key):  # a TREC run file's columns are separated by whitespace
            raise UserError(f"{where}: id {key!r} is empty or holds whitespace")
        if key in out:
            raise UserError(f"{where}: id {key!r} is given twice")
        title = str(record.get("title") or "").strip() if document else ""
        out[key] = f"{title} {record['text']}" if title else record["text"]
    if not out:
        raise UserError(f"{path}: no records")
    return out


def _qrels(path: Path, queries: dict[str, str], corpus: dict[str, str]) -> dict[str, dict[str, int]]:
    lines = read_text(path).split("\n")
    header = tuple(cell.strip() for cell in lines[0].split("\t"))
    if header != QRELS_HEADER:
        raise UserError(f"{path}:1: expected the header {' <tab> '.join(QRELS_HEADER)}, got {lines[0]!r}")
    out: dict[str, dict[str, int]] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        where = f"{path}:{number}"
        if len(cells) != 3:
            raise UserError(f"{where}: expected query-id, corpus-id and score separated by tabs, got {line!r}")
        query, doc, score = (cell.strip() for cell in cells)
        if query not in queries:
            raise UserError(f"{where}: query {query!r} is not in queries.jsonl")
        if doc not in corpus:
            raise UserError(f"{where}: document {doc!r} is not in corpus.jsonl")
        if not is_integer_text(score):
            raise UserError(f"{where}: score {score!r} is not an integer")
        judged = out.setdefault(query, {})
        if doc in judged:
            raise UserError(f"{where}: query {query!r} and document {doc!r} are judged twice in this file")
        judged[doc] = int(score)
    return out
