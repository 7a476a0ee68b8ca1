"""Small file-system helpers shared by the CLI commands."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from roformer.errors import UserError

# Files that make up an HF tokenizer; copied along with a model so that the directory stays self-contained.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "added_tokens.json",
)


def check_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty output directory unless `overwrite`, and a path that is a file.

    Raises:
        UserError: naming the path and the flag that would allow it.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out}: output directory is not empty (pass --overwrite to replace it)")


@contextmanager
def staged_output_dir(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces `out` only when the block succeeds.

    A failure half-way leaves `out` exactly as it was, and a crash leaves at most a hidden `.tmp` directory.
    """
    out = Path(out)
    check_output_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


def copy_tokenizer_files(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer files present in `source` to `target`; returns the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
            copied.append(name)
    return copied
