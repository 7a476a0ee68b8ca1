"""One table from the results of scripts/gpu/gpu_check.sh: GPU tests, model benchmark (eager, compiled), base
pretraining.

    python scripts/gpu/gpu_report.py OUT_DIR [--runs EXPERIMENT_DIR]

Missing stages are reported as not run; the targets of the GPU issue are checked where their numbers exist
(MFU >= 45% at T=512 compiled, >= 1.5x HF RoFormer's tokens/s with less peak memory, no non-finite loss).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

MFU_TARGET, SPEEDUP_TARGET = 0.45, 1.5


def tests_section(out: Path) -> list[str]:
    path = out / "gpu-tests.xml"
    if not path.is_file():
        return ["GPU tests: not run"]
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    lines = [f"GPU tests: {passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped"]
    for case in suite.iter("testcase"):
        for kind in ("failure", "error"):
            problem = case.find(kind)
            if problem is not None:
                lines.append(f"- FAILED {case.get('name')}: {(problem.get('message') or '').splitlines()[0][:200]}")
    return lines


def bench_section(out: Path) -> list[str]:
    lines = [
        "",
        "| mode | T x batch | model | tokens/s | vs HF RoFormer | MFU (GEMM) | MFU (spec) | peak MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    found = False
    for mode, path in [("eager", out / "bench-eager.json"), *(("compiled", p) for p in _compiled(out))]:
        if not path.is_file():
            continue
        found = True
        for row in json.loads(path.read_text()):
            tps, hf = row["tokens_per_sec"], row["tokens_per_sec"]["hf-roformer"]
            for name, rate in tps.items():
                spec = row.get("spec_tflops")
                spec_mfu = f"{100 * rate * row['flops_per_token'][name] / 1e12 / spec:.1f}%" if spec else "-"
                lines.append(
                    f"| {mode} | {row['seq_len']} x {row['batch']} | {name} | {rate:,.0f} | {rate / hf:.2f}x "
                    f"| {100 * row['mfu'][name]:.1f}% | {spec_mfu} | {row['peak_mb'][name]:,.0f} |"
                )
    return lines + ["", *targets(out)] if found else ["", "Benchmark: not run"]


def _compiled(out: Path) -> list[Path]:
    """The compiled benchmark's files: one of every shape, or one per shape (`gpu_check.sh lease`)."""
    return [out / "bench-compiled.json", out / "bench-compiled-short.json"]


def targets(out: Path) -> list[str]:
    path = out / "bench-compiled.json"
    if not path.is_file():
        return []
    rows = {row["seq_len"]: row for row in json.loads(path.read_text())}
    row = rows.get(512) or rows[max(rows)]
    ours, hf = row["tokens_per_sec"]["ours-rotary"], row["tokens_per_sec"]["hf-roformer"]
    memory = row["peak_mb"]["ours-rotary"] < row["peak_mb"]["hf-roformer"]
    mfu = row["mfu"]["ours-rotary"]
    return [
        f"Targets at T={row['seq_len']}, compiled, ours-rotary: MFU {100 * mfu:.1f}% "
        f"({'met' if mfu >= MFU_TARGET else 'NOT met'}, >= {100 * MFU_TARGET:.0f}%); {ours / hf:.2f}x HF RoFormer "
        f"({'met' if ours / hf >= SPEEDUP_TARGET else 'NOT met'}, >= {SPEEDUP_TARGET}x); peak memory "
        f"{'below' if memory else 'NOT below'} HF RoFormer's"
    ]


def relative_section(out: Path) -> list[str]:
    """Every position encoding against rotary (bench-relative.json), then the terms' timings (relative-terms.md)."""
    path = out / "bench-relative.json"
    if not path.is_file():
        return ["", "Position encodings: not run"]
    lines = [
        "",
        "| T x batch | encoding | tokens/s | vs rotary | peak MiB | memory vs rotary |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in json.loads(path.read_text()):
        tps, mem = row["tokens_per_sec"], row["peak_mb"]
        for name, rate in tps.items():
            lines.append(
                f"| {row['seq_len']} x {row['batch']} | {name.removeprefix('ours-')} | {rate:,.0f} "
                f"| {rate / tps['ours-rotary']:.2f}x | {mem[name]:,.0f} | {mem[name] / mem['ours-rotary']:.2f}x |"
            )
    terms = out / "relative-terms.md"
    return lines + (["", terms.read_text().strip()] if terms.is_file() else [])


def packing_section(out: Path) -> list[str]:
    """Packed and unpadded batches, with the mask and with the variable-length kernel (packing.md, as printed)."""
    packing = out / "packing.md"
    return ["", packing.read_text().strip()] if packing.is_file() else ["", "Packing: not run"]


def pretrain_section(out: Path, runs: Path | None) -> list[str]:
    summary = out / "base-summary.json"
    if summary.is_file():
        arms = {arm["label"]: arm for arm in json.loads(summary.read_text())["arms"]}
    else:  # the experiment was stopped before its comparison: each arm's last evaluation, from its metrics
        arms = _arms_from_metrics(runs) if runs else {}
        if not arms:
            return ["", "Base pretraining: not run"]
    lines = [
        "",
        "| arm | steps | final eval loss | eval accuracy | median tokens/s | non-finite losses |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, arm in arms.items():
        events = _train_events(runs, label) if runs else []
        rates = [e["tokens_per_sec"] for e in events if e["event"] == "train" and "tokens_per_sec" in e]
        bad = sum(e["event"] == "skipped" or not math.isfinite(e["loss"]) for e in events)
        lines.append(
            f"| {label} | {arm.get('final_step', '-')} | {arm['final_eval_loss']:.3f} "
            f"| {_fmt(arm.get('final_eval_accuracy'))} | {statistics.median(rates) if rates else 0:,.0f} "
            f"| {bad if events else '-'} |"
        )
    return lines


def _arms_from_metrics(runs: Path) -> dict[str, dict]:
    """Each arm's last evaluation (seed 0) as the comparison would report it, for an experiment cut short."""
    arms = {}
    for path in sorted(runs.glob("*-seed0/metrics.jsonl")):
        evals = [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "eval"]
        if evals:
            last = evals[-1]
            arms[path.parent.name.removesuffix("-seed0")] = {
                "final_step": last["step"],
                "final_eval_loss": last["eval_loss"],
                "final_eval_accuracy": last.get("eval_accuracy"),
            }
    return arms


def _train_events(runs: Path, label: str) -> list[dict]:
    events = []
    for path in sorted(runs.glob(f"{label}-seed*/metrics.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") in ("train", "skipped"):  # skipped: a non-finite update the guard dropped
                events.append(event)
    return events


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=Path, help="the experiment directory of the pretrain stage")
    args = parser.parse_args()
    device = args.out / "device.txt"
    lines = [f"# GPU check: {device.read_text().strip() if device.is_file() else 'device unknown'}", ""]
    lines += tests_section(args.out) + bench_section(args.out) + relative_section(args.out) + packing_section(args.out)
    lines += pretrain_section(args.out, args.runs)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
