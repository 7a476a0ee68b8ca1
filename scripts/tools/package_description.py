"""Write PACKAGE.md, the package index's long description, from README.md (pyproject.toml: `readme = "PACKAGE.md"`).

The README links to docs/ and source files by relative paths, which work in the repository and on a code host but
not on the package index, which renders the long description alone. This keeps README.md the one source and derives
the index's page from it: a relative link becomes its text followed by the path in backticks (the files ship in the
source distribution: MANIFEST.in), a relative image is dropped with its line, absolute links are kept.

    python scripts/tools/package_description.py           # rewrite PACKAGE.md after editing README.md
    python scripts/tools/package_description.py --check   # exit 1 if PACKAGE.md is stale (tests/e2e/test_package.py)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER = "<!-- generated from README.md by scripts/tools/package_description.py: edit README.md, then run it -->\n"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _absolute(target: str) -> bool:
    return re.match(r"[a-z][a-z0-9+.-]*:", target) is not None or target.startswith("#")


def package_description(readme: str) -> str:
    """README.md's text with every relative link and image made readable without the repository."""
    lines = []
    for line in readme.splitlines():
        if re.fullmatch(r"\s*!\[[^\]]*\]\(([^)]+)\)\s*", line) and not _absolute(line.split("(")[-1]):
            continue  # a plot from docs/: the index cannot show it
        lines.append(LINK.sub(_rewrite, line))
    text = "\n".join(lines) + "\n"
    return HEADER + re.sub(r"\n{3,}", "\n\n", text)


def _rewrite(match: re.Match[str]) -> str:
    image, text, target = match.groups()
    if _absolute(target):
        return match[0]
    path = target.split("#")[0]
    if image:
        return text
    return text if text.strip("`") == path else f"{text} (`{path}`)"


def main() -> int:
    text = package_description((REPO / "README.md").read_text(encoding="utf-8"))
    target = REPO / "PACKAGE.md"
    if sys.argv[1:] == ["--check"]:
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            print("PACKAGE.md is stale: run python scripts/tools/package_description.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
