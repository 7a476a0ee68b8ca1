"""The paper's fig. 2 (RoFormer sec. 3.4.3): RoPE's relative upper bound against the relative distance.

    python scripts/studies/long_term_decay.py                  # docs/rope-long-term-decay.png (d = 128), and the table
    python scripts/studies/long_term_decay.py --head-size 64 --out bound-64.png

Prints the bound at the distances docs/length-generalization.md tabulates (two decimals) as a markdown table, and
draws it over distances 0 to --max-distance (a point every 0.1, as a smooth curve) into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from roformer.files import atomic_write
from roformer.study.decay import FIGURE_HEAD_SIZE, TABLE_DISTANCES, relative_upper_bound
from roformer.study.markdown import upper_bound_table
from roformer.study.plots import plot_upper_bound

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-size", type=int, default=FIGURE_HEAD_SIZE, help="d, the rotated features of a head")
    parser.add_argument("--base", type=float, default=10000.0, help="the rotary base")
    parser.add_argument("--max-distance", type=int, default=256, help="the figure's last distance")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "rope-long-term-decay.png", help="the PNG")
    args = parser.parse_args()
    table = relative_upper_bound(TABLE_DISTANCES, args.head_size, args.base).tolist()
    print(upper_bound_table(list(TABLE_DISTANCES), table, args.head_size), end="")
    distances = [i / 10 for i in range(10 * args.max_distance + 1)]
    values = relative_upper_bound(distances, args.head_size, args.base).tolist()
    atomic_write(args.out, lambda tmp: plot_upper_bound(distances, values, args.head_size, args.base, tmp))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
