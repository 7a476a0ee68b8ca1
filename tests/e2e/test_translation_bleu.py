"""The tokenized lower-cased BLEU of a run's results equals sacremoses + sacreBLEU run by hand on its hypotheses."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_translation import config, corpus, finetune, reference  # noqa: F401 (fixtures)


def by_hand(hypotheses: list[str], references: list[str], language: str) -> float:
    """Multi30k's lc.norm.tok recipe written out: lower-case, normalise, tokenize, BLEU with no tokenizer."""
    import sacrebleu
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalise, tokenize = MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language)

    def prepare(line: str) -> str:
        return tokenize.tokenize(normalise.normalize(line.lower()), return_str=True, escape=False)

    ours, theirs = [prepare(h) for h in hypotheses], [prepare(r) for r in references]
    return sacrebleu.corpus_bleu(ours, [theirs], tokenize="none", force=True).score


def read(path: Path) -> list[str]:
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    with opened as lines:
        return [line.strip() for line in lines]


def test_results_give_the_tokenized_lower_cased_bleu_of_the_written_hypotheses(
    reference: tuple[Path, Path],  # noqa: F811
    corpus: Path,  # noqa: F811
) -> None:
    _, run = reference
    summary = json.loads((run / "results.json").read_text())["translation"]
    for model in ("best", "averaged"):
        for split, prefix in (("test", "test"), ("valid", "valid")):
            scores = summary[model][split]
            hypotheses = (run / "hypotheses" / model / f"{split}.de").read_text(encoding="utf-8").splitlines()
            references = read(corpus / f"{prefix}.de")
            assert scores["bleu_tok_lc"] == pytest.approx(by_hand(hypotheses, references, "de"), abs=1e-9)
            assert scores["bleu_tok_lc_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|")
            assert "lc.norm.tok" in scores["bleu_tok_lc_recipe"]
