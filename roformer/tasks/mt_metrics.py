"""Translation metrics: sacreBLEU's corpus BLEU and chrF++, with their signatures (Post 2018), never our own BLEU.

BLEU is sacreBLEU's default: detokenized, cased hypotheses against one reference each, its `13a` tokenization,
exponential smoothing. chrF++ is `CHRF(word_order=2)` (Popović 2017: character n-grams up to 6 and word n-grams up to
2). A signature (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`) says how a score was computed: the
tokenized, lower-cased BLEU of older papers (the RoFormer paper's WMT14 table is `multi-bleu.perl` on tokenized text,
with compound splitting) is another number, not comparable with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any


def _metrics() -> tuple[Any, Any]:
    """New metric objects (a sacreBLEU metric keeps what it last scored: one per call, no state shared)."""
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(), CHRF(word_order=2)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """`bleu` and `chrf` (chrF++) of detokenized hypotheses against one reference each, in sacreBLEU's 0-100 scale.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = _metrics()
    hypotheses, references = list(hypotheses), [list(references)]
    return {
        "bleu": float(bleu.corpus_score(hypotheses, references).score),
        "chrf": float(chrf.corpus_score(hypotheses, references).score),
    }


@cache
def signatures() -> dict[str, str]:
    """The signature of each metric (`bleu`, `chrf`) as `corpus_scores` computes it: one reference each."""
    bleu, chrf = _metrics()
    for metric in (bleu, chrf):  # the signature names the reference count, known once a corpus was scored
        metric.corpus_score(["a"], [["a"]])
    return {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}


def lowercase_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """BLEU of lower-cased text as sacreBLEU computes it (`case:lc`, `13a` tokenization), and its signature.

    The nearest sacreBLEU has to the tokenized, lower-cased `multi-bleu.perl` BLEU that Multi30k papers report (Moses
    tokenization differs from 13a in details, so the two are close, not equal); for comparing with those numbers.
    """
    from sacrebleu.metrics import BLEU

    metric = BLEU(lowercase=True)
    score = metric.corpus_score(list(hypotheses), [list(references)]).score
    return float(score), str(metric.get_signature())
