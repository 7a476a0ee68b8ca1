"""The comparison of a task study whose tasks are translation (configs/experiments/translation-multi30k.yaml).

Per task and arm, over the seeds that finished: test BLEU and chrF++ (sacreBLEU's, detokenized and cased) of each
seed and their mean with a 95% t-interval, on every final split but the dev set (`test`, and `long` for a task
trained with `data.translation.max_source_words`); BLEU by source length (buckets of source words) on those splits;
and sacreBLEU's paired bootstrap (Koehn 2004, 1000 resamples, its fixed seed) of every arm's best seed against the
first arm's best seed, a seed being best by its dev BLEU (never by test). The translations scored are the averaged
model's where every run has one (the paper's setup: the average of the last checkpoints), else the best
checkpoint's. `bleu-by-length.png` draws BLEU against source length, a panel per task, a line per arm, 95% bands.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roformer.errors import UserError
from roformer.study.runs import run_seconds
from roformer.study.stats import mean_interval
from roformer.tasks.build import make_task
from roformer.tasks.mt_metrics import (
    TOKENIZED_LOWERCASE_RECIPE,
    corpus_bleu,
    corpus_scores,
    lowercase_signature,
    tokenized_lowercase_signature,
)
from roformer.tasks.parallel import source_words
from roformer.train.run_dir import RESULTS_FILE

if TYPE_CHECKING:
    from roformer.train.config import FinetuneConfig

PLOT_FILE = "bleu-by-length.png"
# Source words per bucket: Multi30k's test_2016_flickr has 281, 353, 221, 108 and 37 sentences in them, so the
# longest bucket still holds a corpus BLEU's worth of sentences; a task trained on sources of <= 15 words meets
# lengths it never saw in the last two.
BUCKETS = ((1, 9), (10, 12), (13, 15), (16, 20), (21, None))
BOOTSTRAP_SAMPLES = 1000
HYPOTHESES_DIR = "hypotheses"  # a finished run's final translations: hypotheses/<best|averaged>/<split>.<lang>


def bucket_name(low: int, high: int | None) -> str:
    """`10-12`, or `21+` for the open last bucket."""
    return f"{low}+" if high is None else f"{low}-{high}"


def summarise_translation(
    directories: dict[str, list[Path]], config: FinetuneConfig, seeds: list[int]
) -> dict[str, Any]:
    """One translation task's comparison (its sources and references read from the task's files).

    Args:
        directories: {arm: its runs' directories, one per seed in `seeds` order}.
        config: The task's config (any arm's: arms differ in position fields alone, so the data are the same).
        seeds: The study's seeds.

    Returns:
        The task's entry of the study summary (`compare_translations`).
    """
    task = make_task(config.data)
    splits = [name for name in task.test_splits if name != "valid"]
    texts = {name: task.texts[name] for name in splits}
    summary = compare_translations(
        directories,
        seeds,
        {name: t.sources for name, t in texts.items()},
        {name: t.targets for name, t in texts.items()},
        config.data.target_lang,
    )
    return {
        "languages": f"{config.data.source_lang}-{config.data.target_lang}",
        "max_source_words": task.settings.max_source_words,
        **summary,
    }


def compare_translations(
    directories: dict[str, list[Path]],
    seeds: list[int],
    sources: dict[str, list[str]],
    references: dict[str, list[str]],
    target_lang: str,
) -> dict[str, Any]:
    """Score every finished run's final translations of each split and compare the arms.

    Args:
        directories: {arm: its runs' directories, one per seed in `seeds` order}; an arm with no finished run is
            left out.
        seeds: The study's seeds.
        sources: {split: its source sentences} (for the length buckets).
        references: {split: its reference translations}.
        target_lang: The suffix of the hypothesis files (`hypotheses/<model>/<split>.<target_lang>`).

    Returns:
        `kind: translation`, the splits' sizes, the buckets, the model scored, per arm its finished seeds, their
        BLEU and chrF++ with intervals, BLEU by bucket, the scored model's dev BLEU and seconds per seed, each arm's
        best seed by that dev BLEU, and the bootstrap of the best seeds against the first arm's.
    """
    finished = {arm: [d for d in runs if (d / RESULTS_FILE).is_file()] for arm, runs in directories.items()}
    finished = {arm: runs for arm, runs in finished.items() if runs}
    every = [d for runs in finished.values() for d in runs]
    model = "averaged" if every and all((d / HYPOTHESES_DIR / "averaged").is_dir() for d in every) else "best"
    arms: dict[str, Any] = {}
    best_seed: dict[str, int] = {}
    best_hypotheses: dict[str, dict[str, list[str]]] = {}
    for arm, runs in finished.items():
        files = {name: [d / HYPOTHESES_DIR / model / f"{name}.{target_lang}" for d in runs] for name in references}
        hypotheses = {name: [read_hypotheses(f, len(references[name])) for f in files[name]] for name in references}
        dev = [dev_bleu(d, model) for d in runs]
        table: dict[str, Any] = {"seeds": [seeds[directories[arm].index(d)] for d in runs], "dev_bleu": dev}
        table["seconds"] = [run_seconds(d) for d in runs]
        table["splits"] = {}
        for name, refs in references.items():
            scores = [
                {**corpus_scores(h, refs, target_lang), "bleu_lc": corpus_bleu(h, refs, lowercase=True)}
                for h in hypotheses[name]
            ]
            table["splits"][name] = {
                metric: {"seeds": [s[metric] for s in scores], **mean_interval([s[metric] for s in scores])}
                for metric in ("bleu", "chrf", "bleu_lc", "bleu_tok_lc")
            }
            table["splits"][name]["buckets"] = {
                bucket: {"sentences": count, "seeds": values, **mean_interval(values)}
                for bucket, (count, values) in bleu_by_bucket(hypotheses[name], refs, sources[name]).items()
            }
        arms[arm] = table
        best = max(range(len(runs)), key=lambda i: dev[i])  # by dev BLEU: test never chooses
        best_seed[arm] = table["seeds"][best]
        best_hypotheses[arm] = {name: hypotheses[name][best] for name in references}
    bootstrap = {
        name: paired_bootstrap({arm: h[name] for arm, h in best_hypotheses.items()}, refs)
        for name, refs in references.items()
        if len(best_hypotheses) > 1
    }
    return {
        "kind": "translation",
        "model": model,
        "bleu_lc_signature": lowercase_signature(),
        "bleu_tok_lc_signature": tokenized_lowercase_signature(),
        "splits": {name: len(refs) for name, refs in references.items()},
        "buckets": [bucket_name(*b) for b in BUCKETS],
        "bucket_sentences": {name: bucket_sizes(text) for name, text in sources.items()},
        "arms": arms,
        "best_seeds": best_seed,
        "bootstrap": bootstrap,
    }


def read_hypotheses(path: Path, expected: int) -> list[str]:
    """A hypotheses file's lines, one per source line.

    Split at newlines alone: a hypothesis may hold any other line-breaking character (str.splitlines would split it).

    Raises:
        UserError: the file holds another number of lines than its split has sources.
    """
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    if len(lines) != expected:
        raise UserError(f"{path}: {len(lines)} hypotheses for {expected} sources (the run's files are incomplete)")
    return lines


def dev_bleu(directory: Path, model: str) -> float:
    """The dev BLEU of a run's `best` checkpoint (what selected it) or of its `averaged` model."""
    results = json.loads((directory / RESULTS_FILE).read_text())
    selected = results["selected"]
    run = next(r for r in results["runs"] if (r["peak_lr"], r["seed"]) == (selected["peak_lr"], selected["seed"]))
    scored = run["averaged"] if model == "averaged" else run
    return float(scored["dev"]["dev"]["bleu"])


def bucket_rows(sources: list[str]) -> dict[str, list[int]]:
    """{bucket: the indices of its sources} over BUCKETS of source words; empty buckets left out."""
    words = [source_words(text) for text in sources]
    out = {}
    for low, high in BUCKETS:
        rows = [i for i, n in enumerate(words) if n >= low and (high is None or n <= high)]
        if rows:
            out[bucket_name(low, high)] = rows
    return out


def bucket_sizes(sources: list[str]) -> dict[str, int]:
    """{bucket: how many sources it holds} (empty buckets left out)."""
    return {bucket: len(rows) for bucket, rows in bucket_rows(sources).items()}


def bleu_by_bucket(
    hypotheses: list[list[str]], references: list[str], sources: list[str]
) -> dict[str, tuple[int, list[float]]]:
    """{bucket: (its sentences, each seed's corpus BLEU on them)} over BUCKETS of source words (empty ones left out)."""
    out = {}
    for bucket, rows in bucket_rows(sources).items():
        values = [corpus_bleu([h[i] for i in rows], [references[i] for i in rows]) for h in hypotheses]
        out[bucket] = (len(rows), values)
    return out


def paired_bootstrap(systems: dict[str, list[str]], references: list[str]) -> dict[str, Any]:
    """The paired bootstrap of BLEU (sacreBLEU's): the first system against each other one.

    Returns:
        `baseline`, `signature`, and per system its BLEU, the bootstrap mean with its 95% half-width, and (not for
        the baseline) the p-value of the difference: sacreBLEU's, (resamples whose difference exceeds the observed
        one + 1) / (resamples + 1), which is its smallest value for a system equal to the baseline (multeval's
        choice: "a zero difference should not be attributed to chance"). Such a system is marked `identical` and
        its p-value left out, so a table never shows a significant difference between equal outputs.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    named = list(systems.items())
    sacrebleu_log = logging.getLogger("sacrebleu")
    level = sacrebleu_log.level
    sacrebleu_log.setLevel(max(level, logging.WARNING))  # its progress lines (INFO) would interleave with our tqdm
    try:
        signatures, results = PairedTest(
            named, {"BLEU": BLEU()}, [references], test_type="bs", n_samples=BOOTSTRAP_SAMPLES
        )()
    finally:
        sacrebleu_log.setLevel(level)
    per_system = {}
    baseline = named[0][1]
    for (name, hypotheses), result in zip(named, results["BLEU"], strict=True):
        identical = name != named[0][0] and hypotheses == baseline
        per_system[name] = {
            "bleu": float(result.score),
            "mean": float(result.mean),
            "half_width": float(result.ci),
            "p_value": None if result.p_value is None or identical else float(result.p_value),
            "identical": identical,
        }
    return {"baseline": named[0][0], "signature": str(signatures["BLEU"]), "systems": per_system}


def translation_markdown(task: str, data: dict[str, Any], seeds: list[int]) -> str:
    """A task's tables: BLEU and chrF++ per split, BLEU by source length, the bootstrap."""
    note = f"; trained on sources of <= {data['max_source_words']} words" if data["max_source_words"] else ""
    parts = [
        f"### {task}\n\n{data['languages']}{note}; sacreBLEU BLEU and chrF++ (detokenized, cased) of the "
        f"{data['model']} model, mean over the finished seeds of {len(seeds)} [95% t-interval]; the same model's dev "
        "BLEU of each seed (what picks an arm's best seed); seconds per run\n"
    ]
    header = ["arm", "seeds"]
    for name, count in data["splits"].items():
        header += [f"{name} BLEU ({count})", f"{name} chrF++", f"{name} BLEU tok. lc"]
    header += ["dev BLEU", "s/run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, table in data["arms"].items():
        cells = [arm, str(len(table["seeds"]))]
        for name in data["splits"]:
            cells += [interval_cell(table["splits"][name][m]) for m in ("bleu", "chrf", "bleu_tok_lc")]
        cells.append(", ".join(f"{v:.1f}" for v in table["dev_bleu"]))
        cells.append(f"{sum(table['seconds']) / max(1, len(table['seconds'])):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\nBLEU tok. lc: Multi30k papers' tokenized lower-cased BLEU ({TOKENIZED_LOWERCASE_RECIPE}; "
        f"{data['bleu_tok_lc_signature']}); summary.json also holds sacreBLEU's lower-cased 13a BLEU (`bleu_lc`)"
    )
    parts.append("\n".join(lines) + "\n")
    for name in data["splits"]:
        header = ["arm", *data["buckets"]]
        lines = [f"BLEU by source words, {name}:\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for arm, table in data["arms"].items():
            buckets = table["splits"][name]["buckets"]
            cells = [interval_cell(buckets[b]) if b in buckets else "" for b in data["buckets"]]
            lines.append("| " + " | ".join([arm, *cells]) + " |")
        sizes = data["bucket_sentences"][name]
        lines.append("| sentences | " + " | ".join(str(sizes.get(b, 0)) for b in data["buckets"]) + " |")
        parts.append("\n".join(lines) + "\n")
    for name, test in data["bootstrap"].items():
        lines = [
            f"Paired bootstrap on {name}, each arm's best seed by dev BLEU ({test['signature']}):\n",
            "| arm | seed | BLEU | bootstrap mean +- 95% | p vs " + test["baseline"] + " |",
            "|---|---|---|---|---|",
        ]
        for arm, result in test["systems"].items():
            p = "identical" if result["identical"] else "-" if result["p_value"] is None else f"{result['p_value']:.4f}"
            lines.append(
                f"| {arm} | {data['best_seeds'][arm]} | {result['bleu']:.2f} | {result['mean']:.2f} +- "
                f"{result['half_width']:.2f} | {p} |"
            )
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def interval_cell(cell: dict[str, Any]) -> str:
    """`26.4 [25.1, 27.7]` (a mean and its interval; the mean alone for one seed)."""
    interval = cell["interval"]
    spread = f" [{interval[0]:.1f}, {interval[1]:.1f}]" if interval else ""
    return f"{cell['mean']:.1f}{spread}"


def bleu_plot_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Points of BLEU against source length: per translation task and arm, its `test` split's buckets."""
    rows = []
    for task, data in summary["tasks"].items():
        if data.get("kind") != "translation":
            continue
        for arm, table in data["arms"].items():
            buckets = table["splits"].get("test", {}).get("buckets", {})
            for position, bucket in enumerate(data["buckets"]):
                if bucket in buckets:
                    cell = buckets[bucket]
                    interval = cell["interval"] or [cell["mean"], cell["mean"]]
                    point = {"task": task, "arm": arm, "x": position, "bucket": bucket, "bleu": cell["mean"]}
                    rows.append({**point, "interval": interval})
    return rows
