"""The pictures of the studies: curves.png, length.png and probes.png of a comparison; the long-term decay.

Loss curves with seed bands, loss against length, and probe accuracy against length; RoPE's relative upper bound
(the paper's fig. 2) and a model's mean attention logit and weight against distance (roformer attention-distance).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from roformer.study.runs import Arm, PretrainRun, tokens_at

# what an interval band around a line is, named in the plots' legends (a seed's band is flat: no interval)
INTERVAL_BAND = "band: 95% t-interval over seeds"
PROBE_BAND = "band: 95% interval (Wilson over answers, widened to the t-interval over seeds)"


def _series(
    runs: list[PretrainRun], events: str, y: str, x: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Mean x, mean y, min y, max y over the runs of an arm, at the steps every run logged."""
    per_run = [{e["step"]: e for e in getattr(r, events) if y in e} for r in runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    xs, mean, low, high = [], [], [], []
    for step in steps:
        values = [p[step][y] for p in per_run]
        if x == "step":
            xs.append(step)
        else:
            xs.append(statistics.fmean(_x_value(r, p[step], x, step) for r, p in zip(runs, per_run)))
        mean.append(statistics.fmean(values))
        low.append(min(values))
        high.append(max(values))
    return xs, mean, low, high


def _x_value(run: PretrainRun, event: dict[str, Any], x: str, step: int) -> float:
    if x in event:
        return float(event[x])
    if x == "tokens_seen":
        return tokens_at(run, step) or 0.0
    return float(event.get("elapsed_sec", 0.0))


def plot_curves(arms: list[Arm], path: Path) -> None:
    """curves.png: train and eval MLM loss against steps, tokens seen and training seconds; seeds as min-max bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_x = [("step", "optimizer steps"), ("tokens_seen", "tokens seen"), ("elapsed_sec", "training seconds")]
    rows = [("train", "loss", "train MLM loss"), ("eval", "eval_loss", "eval MLM loss (fixed mask)")]
    fig, axes = plt.subplots(len(rows), len(axes_x), figsize=(15, 8), squeeze=False)
    for i, (events, y, ylabel) in enumerate(rows):
        for j, (x, xlabel) in enumerate(axes_x):
            ax = axes[i][j]
            for arm in arms:
                xs, mean, low, high = _series(arm.runs, events, y, x)
                if not xs:
                    continue
                band = ", band: min-max over seeds" if len(arm.runs) > 1 else ""  # what the shading is, in the legend
                label = f"{arm.label} ({len(arm.runs)} seed{'s' if len(arm.runs) > 1 else ''}{band})"
                (line,) = ax.plot(xs, mean, label=label, linewidth=1.5)
                if len(arm.runs) > 1:
                    ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_probes(rows: list[dict[str, Any]], path: Path, band: str = PROBE_BAND, per_row: int | None = None) -> None:
    """probes.png: accuracy against length, a panel per probe, a line per arm and scaling.

    An arm is a colour and a scaling a line style, named once each in a legend below the panels, so that two dozen
    lines stay legible; each line's 95% interval is a faint band around it, chance a grey dashed line. Rows that
    carry a `floor` (a task study's position-blind floor at their length) draw it in chance's place, a grey dashed
    line through the lengths, and their `references` ({name: accuracy}, simpler guesses) as grey dotted lines.
    Rows of several distances at one length (passkey-MLM) should come pooled (`probe_table(...,
    pool_distances=True)`); the summary's table keeps them apart.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    probes = sorted({r["probe"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    scalings = list(dict.fromkeys(r["scaling"] for r in rows))
    colours = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    colour = {label: colours(i % colours.N) for i, label in enumerate(labels)}
    style = {scaling: STYLES[i % len(STYLES)] for i, scaling in enumerate(scalings)}
    across = min(per_row or len(probes), len(probes))  # panels a row (`per_row`: a grid of them)
    down = math.ceil(len(probes) / across)
    fig, axes = plt.subplots(down, across, figsize=(5.5 * across, 4.2 * down), squeeze=False)
    for ax in axes.flat[len(probes) :]:
        ax.set_visible(False)
    for ax, probe in zip(axes.flat, probes, strict=False):
        lines: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
        for r in rows:
            if r["probe"] == probe and "accuracy" in r:
                lines.setdefault((r["label"], r["scaling"], r.get("distance")), []).append(r)
        for (label, scaling, _), points in lines.items():
            points.sort(key=lambda r: r["length"])
            x = [r["length"] for r in points]
            ax.plot(x, [r["accuracy"] for r in points], color=colour[label], linestyle=style[scaling], marker=".")
            low, high = [r["interval"][0] for r in points], [r["interval"][1] for r in points]
            ax.fill_between(x, low, high, color=colour[label], alpha=0.06, linewidth=0)
        panel = [r for r in rows if r["probe"] == probe]
        chance = next((r["chance"] for r in panel if "chance" in r), None)
        if any("floor" in r for r in panel):
            _draw_floors(ax, panel)
        elif chance is not None:
            ax.axhline(chance, color="grey", linestyle=(0, (2, 2)), linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("accuracy")
        ax.set_title(probe)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colour[label], label=label) for label in labels]
    if len(scalings) > 1 or scalings != ["none"]:
        handles += [Line2D([], [], color="black", linestyle=style[s], label=f"scaling: {s}") for s in scalings]
    if any("floor" in r for r in rows):
        label = floor_label(rows)
        handles.append(Line2D([], [], color="grey", linestyle=FLOOR_STYLE, linewidth=1.2, label=label))
    if any(r.get("references") for r in rows):
        label = ", ".join(dict.fromkeys(name for r in rows for name in r.get("references", {})))
        handles.append(Line2D([], [], color="grey", linestyle=REFERENCE_STYLE, linewidth=1, label=label))
    if any("chance" in r for r in rows):
        handles.append(Line2D([], [], color="grey", linestyle=(0, (2, 2)), linewidth=1, label="chance"))
    handles.append(Patch(color="grey", alpha=0.2, label=band))
    columns = min(len(handles), 6, 3 * across)  # a panel holds three legend columns
    fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 * math.ceil(len(handles) / columns) / down, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # a one-panel figure's legend is wider than its panel
    plt.close(fig)


STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))  # a line style per scaling
FLOOR_STYLE = (0, (4, 2))  # the position-blind floor: grey, dashed
REFERENCE_STYLE = (0, (1, 2))  # a simpler guess's level: grey, dotted


def floor_label(rows: list[dict[str, Any]]) -> str:
    """The dashed line's legend entry: the position-blind floor, naming a task read against another level."""
    floor = "position-blind floor"
    others = dict.fromkeys(r["floor_name"] for r in rows if not r.get("floor_name", floor).endswith(floor))
    return floor + (f" ({'; '.join(others)})" if others else "")


def _draw_floors(ax: Any, rows: list[dict[str, Any]]) -> None:
    """A panel's floor through its lengths (grey dashed) and each reference level (grey dotted)."""
    by_length = {r["length"]: r for r in rows if "floor" in r}
    lengths = sorted(by_length)
    ax.plot(lengths, [by_length[n]["floor"] for n in lengths], color="grey", linestyle=FLOOR_STYLE, linewidth=1.2)
    for name in dict.fromkeys(name for r in by_length.values() for name in r.get("references", {})):
        levels = [by_length[n]["references"][name] for n in lengths]
        ax.plot(lengths, levels, color="grey", linestyle=REFERENCE_STYLE, linewidth=1)


def plot_bleu_by_length(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """bleu-by-length.png: test BLEU against source length (buckets of words), a panel per task, a line per arm.

    Each line is the mean over seeds with its 95% band; a task trained on short sources gets a grey line where
    its training lengths end.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False, sharey=True)
    for ax, task in zip(axes[0], tasks, strict=True):
        data = summary["tasks"][task]
        for arm in dict.fromkeys(r["arm"] for r in rows if r["task"] == task):
            points = [r for r in rows if r["task"] == task and r["arm"] == arm]
            x = [r["x"] for r in points]
            (line,) = ax.plot(x, [r["bleu"] for r in points], marker="o", label=arm)
            low, high = [r["interval"][0] for r in points], [r["interval"][1] for r in points]
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.1, linewidth=0)
        ax.fill_between([], [], [], color="grey", alpha=0.2, linewidth=0, label=INTERVAL_BAND)
        buckets = data["buckets"]
        if data.get("max_source_words"):  # before the first bucket with no trained length in it
            lows = [int(b.split("-")[0].rstrip("+")) for b in buckets]
            beyond = [i for i, low in enumerate(lows) if low > data["max_source_words"]]
            if beyond:
                ax.axvline(beyond[0] - 0.5, color="grey", linestyle=(0, (2, 2)), linewidth=1)
        ax.set_xticks(range(len(buckets)), buckets)
        ax.set_xlabel("source words")
        ax.set_ylabel("test BLEU")
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lengths(table: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """length.png: eval MLM loss against sequence length per arm (lengths an arm cannot take are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in table.items():
        ok = [r for r in rows if "error" not in r]
        ax.plot([r["seq_len"] for r in ok], [r["eval_loss"] for r in ok], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("eval MLM loss (fixed mask)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_upper_bound(distances: list[float], values: list[float], head_size: int, base: float, path: Path) -> None:
    """The paper's fig. 2: RoPE's relative upper bound against the relative distance (one line, as the paper draws it).

    Written as PNG whatever the path's suffix (an atomic write draws into a temporary name).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(distances, values, linewidth=1.2)
    ax.set_xlabel("relative distance")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"Long-term decay of RoPE (d = {head_size}, base {base:g})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_attention_distance(result: dict[str, Any], path: Path) -> None:
    """attention-distance's picture: mean logit and attention weight against the distance |m - n|, a line per layer.

    The logit panel carries the paper's bound (fig. 2, at the model's head size) on a twin axis, dashed grey; the
    weight panel has a log scale and the uniform weight 1 / T, dotted grey, which a model blind to position would
    give. Written as PNG whatever the path's suffix (an atomic write draws into a temporary name).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = result["distances"]
    colours = plt.get_cmap("viridis")
    layers = result["layers"]
    fig, (logit_ax, weight_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for layer in layers:
        colour = colours(layer["layer"] / max(1, len(layers) - 1))
        label = f"layer {layer['layer']}"
        logit_ax.plot(distances, _with_gaps(layer["mean_logit"]), color=colour, linewidth=1.2, label=label)
        weight_ax.plot(distances, _with_gaps(layer["mean_weight"]), color=colour, linewidth=1.2, label=label)
    bound = result["bound"]
    twin = logit_ax.twinx()
    twin.plot(distances, bound["relative_upper_bound"], color="grey", linestyle="--", linewidth=1)
    twin.set_ylabel(f"RoPE's relative upper bound (d = {bound['head_size']}), dashed", color="grey")
    weight_ax.axhline(1 / result["length"], color="grey", linestyle=":", linewidth=1, label="uniform 1 / T")
    weight_ax.set_yscale("log")
    logit_ax.set_ylabel("mean pre-softmax logit")
    weight_ax.set_ylabel("mean attention weight")
    for ax in (logit_ax, weight_ax):
        ax.set_xlabel("distance |m - n| (tokens)")
        ax.grid(alpha=0.3)
    weight_ax.legend(fontsize=8, ncol=2 if len(layers) > 6 else 1)
    fig.suptitle(
        f"{result['position_encoding']} positions: {result['samples']} windows of {result['length']} tokens "
        f"({result['attention_pattern']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _with_gaps(values: list[float | None]) -> list[float]:
    """A curve's values with NaN where a distance had no pair (matplotlib leaves a gap)."""
    return [math.nan if v is None else v for v in values]
