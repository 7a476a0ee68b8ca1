"""Translation metrics: sacreBLEU's corpus BLEU and chrF++, with their signatures (Post 2018), never our own BLEU.

BLEU is sacreBLEU's default: detokenized, cased hypotheses against one reference each, its `13a` tokenization,
exponential smoothing. chrF++ is `CHRF(word_order=2)` (Popović 2017: character n-grams up to 6 and word n-grams up to
2). A signature (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`) says how a score was computed: the
tokenized, lower-cased BLEU of older papers (the RoFormer paper's WMT14 table is `multi-bleu.perl` on tokenized text,
with compound splitting) is another number, not comparable with these.

`bleu_tok_lc` is that other number as Multi30k papers report it (Wu et al. 2021's 41.02, most of the literature):
BLEU on the `lc.norm.tok` files of the Multi30k repository, which Moses' scripts made from the raw text by
lower-casing, normalising punctuation and tokenizing (`lowercase.perl | normalize-punctuation.perl -l L |
tokenizer.perl -l L`). `TOKENIZED_LOWERCASE_RECIPE` does the same to hypotheses and references with sacremoses
(Moses' scripts ported to Python), then scores with sacreBLEU and no further tokenization (`tok:none`), which is
`multi-bleu.perl` on those files.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any


def _metrics() -> tuple[Any, Any]:
    """New metric objects (a sacreBLEU metric keeps what it last scored: one per call, no state shared)."""
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(), CHRF(word_order=2)


TOKENIZED_LOWERCASE_RECIPE = (
    "hypotheses and references lower-cased, then Moses punctuation normalisation and tokenization in the target "
    "language (sacremoses: MosesPunctNormalizer, MosesTokenizer without escaping or aggressive hyphen splitting), "
    "then sacreBLEU with tokenize=none: multi-bleu.perl on Multi30k's lc.norm.tok files"
)


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], language: str | None = None
) -> dict[str, float]:
    """`bleu` and `chrf` (chrF++) of detokenized hypotheses against one reference each, in sacreBLEU's 0-100 scale.

    With the target `language`, also `bleu_tok_lc`: the tokenized lower-cased BLEU (`tokenized_lowercase_bleu`).

    Raises:
        ValueError: the two lists differ in length.
    """
    _, chrf = _metrics()
    scores = {
        "bleu": corpus_bleu(hypotheses, references),
        "chrf": float(chrf.corpus_score(list(hypotheses), [list(references)]).score),
    }
    if language is not None:
        scores["bleu_tok_lc"] = tokenized_lowercase_bleu(hypotheses, references, language)
    return scores


def moses_tokenized_lowercase(lines: Sequence[str], language: str) -> list[str]:
    """Lines as Multi30k's `lc.norm.tok` files are made from raw text: lower-cased, normalised, Moses-tokenized."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=False) for line in lines]


def tokenized_lowercase_bleu(hypotheses: Sequence[str], references: Sequence[str], language: str) -> float:
    """BLEU of MT papers on Multi30k: both sides through `moses_tokenized_lowercase`, then sacreBLEU, `tok:none`.

    Raises:
        ValueError: the two lists differ in length.
    """
    from sacrebleu.metrics import BLEU

    check_pairs(hypotheses, references)
    ours, theirs = (moses_tokenized_lowercase(lines, language) for lines in (hypotheses, references))
    return float(BLEU(tokenize="none", force=True).corpus_score(ours, [theirs]).score)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> float:
    """The corpus BLEU alone, as sacreBLEU computes it (`corpus_scores`'s `bleu`), or of lower-cased text.

    Lower-cased (`case:lc`, `13a` tokenization) is the nearest sacreBLEU has to the tokenized, lower-cased
    `multi-bleu.perl` BLEU that Multi30k papers report (Moses tokenization differs from 13a in details, so the two
    are close, not equal); for comparing with those numbers.

    Raises:
        ValueError: the two lists differ in length.
    """
    from sacrebleu.metrics import BLEU

    check_pairs(hypotheses, references)
    return float(BLEU(lowercase=lowercase).corpus_score(list(hypotheses), [list(references)]).score)


def check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """One reference for each hypothesis.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")


def _signature(metric: Any) -> str:
    """A metric's signature as it scores one reference each (the count is known once a corpus was scored)."""
    metric.corpus_score(["a"], [["a"]])
    return str(metric.get_signature())


@cache
def signatures() -> dict[str, str]:
    """The signature of each metric (`bleu`, `chrf`) as `corpus_scores` computes it: one reference each."""
    bleu, chrf = _metrics()
    return {"bleu": _signature(bleu), "chrf": _signature(chrf)}


@cache
def lowercase_signature() -> str:
    """The signature of `corpus_bleu(..., lowercase=True)`."""
    from sacrebleu.metrics import BLEU

    return _signature(BLEU(lowercase=True))


@cache
def tokenized_lowercase_signature() -> str:
    """The sacreBLEU signature of `tokenized_lowercase_bleu` (`tok:none`: the text comes tokenized)."""
    from sacrebleu.metrics import BLEU

    return _signature(BLEU(tokenize="none", force=True))
