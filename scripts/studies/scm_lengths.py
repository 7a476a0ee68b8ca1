"""CAIL2019-SCM at two lengths, one model: is the gain of reading 1024 tokens a pair over 512 there, and significant?

Reads the suite directories (`roformer glue` outputs, or an experiment's `glue/<arm>-seed<k>/`) that ran both SCM
tasks of finetune/chinese-cpu.yaml. Each task's runs are the 5 folds of the cross-validation (`fold` in results.json's
runs; older results, whose run of seed s held out fold s, by seed), so the two lengths are compared on the same
held-out triplets: the difference 1024 - 512 is paired by (pretraining run, fine-tuning seed, fold), with a 95% t
interval (roformer.study.stats.difference), per model. Suite directories
named `<label>-seed<k>` are grouped by label.

    python scripts/studies/scm_lengths.py runs/chinese-tiny/glue/*
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from roformer.study.runs import run_key
from roformer.study.stats import difference


def fold_accuracies(suite: Path, task: str) -> dict[int | str, float]:
    """{run (seed and held-out fold): dev accuracy} of one task of a suite directory, at its selected learning rate."""
    results = json.loads((suite / task / "results.json").read_text())
    lr = results.get("selected", {}).get("peak_lr")
    runs = [run for run in results["runs"] if lr is None or run.get("peak_lr") == lr]
    return {run_key(run): run["dev"]["dev"]["accuracy"] for run in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("suites", nargs="+", type=Path, help="suite output directories")
    parser.add_argument("--short", default="cail2019-scm-sample", help="the task at the shorter length")
    parser.add_argument("--long", default="cail2019-scm-sample-1024", help="the task at the longer length")
    args = parser.parse_args()
    groups: dict[str, dict[str, dict[str, float]]] = {}
    for suite in args.suites:
        label = re.sub(r"-seed\d+$", "", suite.name)
        short, long = fold_accuracies(suite, args.short), fold_accuracies(suite, args.long)
        for key, group in (("short", short), ("long", long)):
            groups.setdefault(label, {}).setdefault(key, {}).update({f"{suite.name}/{k}": v for k, v in group.items()})
    print(f"| model | runs x folds | {args.short} | {args.long} | difference [95% interval] | significant |")
    print("|---|---:|---:|---:|---:|---|")
    for label, values in groups.items():
        result = difference(values["long"], values["short"])
        interval = f"[{100 * result['low']:+.1f}, {100 * result['high']:+.1f}]" if result["low"] is not None else "-"
        print(
            f"| {label} | {len(values['short'])} | {100 * statistics.fmean(values['short'].values()):.1f}% "
            f"| {100 * statistics.fmean(values['long'].values()):.1f}% | {100 * result['mean']:+.1f} {interval} "
            f"| {'yes' if result['significant'] else 'no'} ({result['test']}) |"
        )


if __name__ == "__main__":
    main()
