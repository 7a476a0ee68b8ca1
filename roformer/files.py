"""Files and directories that are complete or absent: atomic writes and staged output directories.

Everything the project writes for a user to keep (run directories, model directories, caches, results) goes through
here, so that a crash or a full disk leaves the previous version, never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from roformer.errors import UserError


def check_output_dir(out: Path, overwrite: bool, resume: bool = False) -> None:
    """Refuse an output directory that cannot be used, before any work is done.

    Refused: a path that is a file or lies below one, a directory that cannot be written (or created), and a
    non-empty directory unless `overwrite` (or `resume`, which continues what is there).

    Raises:
        UserError: naming the path and what is wrong (or the flag that would allow it).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    existing = next(p for p in (out, *out.parents) if p.exists())  # the root always exists
    if not existing.is_dir():
        raise UserError(f"{out}: {existing} is a file, so no directory can be made below it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{out}: {existing} is not writable")
    if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
        raise UserError(f"{out}: output directory is not empty (pass --overwrite to replace it)")


def check_output_file(path: Path) -> None:
    """Refuse an output file path that is a directory or whose folder cannot be made or written.

    Raises:
        UserError: naming the path and what is wrong.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a file")
    check_output_dir(path.parent, overwrite=True)


@contextmanager
def staged_output_dir(
    out: str | Path, overwrite: bool = False, keep_existing: Callable[[Path], bool] | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces `out` only when the block succeeds.

    A failure half-way leaves `out` exactly as it was, and a crash leaves at most a hidden `.tmp` directory.

    Args:
        out: The directory to write.
        overwrite: Replace a non-empty `out`.
        keep_existing: For caches that several processes may fill at once: when it is true of an `out` that another
            process published meanwhile, that one is kept and this copy discarded (first wins), instead of deleting a
            directory another process may be reading.
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
    if keep_existing is not None and keep_existing(out):
        shutil.rmtree(staging, ignore_errors=True)
        return
    if out.exists():
        shutil.rmtree(out)
    try:
        staging.rename(out)
    except OSError:  # another process published `out` between the check and the rename
        shutil.rmtree(staging, ignore_errors=True)
        if keep_existing is None or not keep_existing(out):
            raise


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it over `path` (all or nothing)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a UTF-8 text file all or nothing."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_json(path: str | Path, hint: str = "") -> Any:
    """A JSON file we wrote (a record, a store's index), with a one-line error when it is damaged.

    Raises:
        UserError: the file cannot be read or is not valid JSON, naming it (and `hint`: how to get a good one).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"{path}: damaged or unreadable ({type(e).__name__}: {e}){'; ' + hint if hint else ''}"
        ) from None


# ----------------------------------------------------------------------------------------------------------------
# Manifests: the size and sha256 of files (a checkpoint's, in its COMPLETE marker; a model's weights, in model.yaml)


def file_digest(path: Path) -> str:
    """sha256 of a file, read in chunks."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path, names: list[str] | None = None) -> dict[str, list[Any]]:
    """{relative path: [size, sha256]} of every file below `directory` (or of the files `names` in it)."""
    if names is None:
        files = sorted(p for p in directory.rglob("*") if p.is_file())
    else:
        files = [directory / name for name in names]
    return {str(p.relative_to(directory)): [p.stat().st_size, file_digest(p)] for p in files}


def verify_manifest(directory: Path, manifest: dict[str, list[Any]]) -> str | None:
    """None if every file of the manifest is there with its size and checksum, else what is wrong (one phrase)."""
    for name, (size, digest) in manifest.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
        if file_digest(path) != digest:
            return f"{name} does not match its checksum"
    return None
