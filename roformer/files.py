"""Files and directories that are complete or absent: atomic writes and staged output directories.

Everything the project writes for a user to keep (run directories, model directories, caches, results) goes through
here, so that a crash or a full disk leaves the previous version, never a half-written one. A write that fails for
a reason outside the code (disk full, quota, read-only or failing disk) stops the command with `WriteFailed`: one
line naming the path, exit code 74 (docs/cli.md), and what was there before is as it was.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from roformer.errors import UserError, WriteFailed

# a write that failed for a reason outside the code: no space, quota, too large, read-only or failing disk, no
# permission to write there
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM})


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

    Raises:
        WriteFailed: a write in the block (or the publishing rename) failed, naming `out`; `out` is as it was.
    """
    out = Path(out)
    check_output_dir(out, overwrite)
    with stop_on_write_failure(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        with stop_on_write_failure(out):
            yield staging
    except WriteFailed as e:  # a file in the block named its hidden staging path: name what the user asked for
        shutil.rmtree(staging, ignore_errors=True)
        path, detail = getattr(e, "path", None), getattr(e, "detail", None)
        if path is None or detail is None or not Path(path).is_relative_to(staging):
            raise
        raise _write_failed(out, detail, f" ({Path(path).relative_to(staging)})") from None
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
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it over `path` (all or nothing).

    The file's folder is made if it is missing: every command that takes `--out FILE` writes through here after its
    work, so a new folder must not cost the work (`check_output_file` has checked before it that it can be made).

    Raises:
        WriteFailed: the write failed (disk full, read-only, no permission), naming `path`; `path` is as it was.
        UserError: `path` cannot be replaced by a file (a folder is there, or a file where its folder goes), naming
            it; nothing is left behind.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with stop_on_write_failure(path):
            _make_folder(path)
            write(tmp)
            _replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _make_folder(path: Path) -> None:
    """The folder `path` is written in, made if missing; a file in its way is the user's to move (exit 2)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise UserError(f"{path}: cannot make its folder ({e.strerror}: {e.filename})") from None


def _replace(tmp: Path, path: Path) -> None:
    """Rename `tmp` over `path`; a folder in the way is the user's to move (exit 2), not a failing disk."""
    try:
        os.replace(tmp, path)
    except (IsADirectoryError, NotADirectoryError) as e:
        raise UserError(f"{path}: cannot write a file there ({e.strerror})") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a UTF-8 text file all or nothing."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_copy(source: str | Path, target: str | Path) -> None:
    """Copy a file (with its times) all or nothing."""
    atomic_write(target, lambda tmp: shutil.copy2(source, tmp))


# ----------------------------------------------------------------------------------------------------------------
# Failed writes: recognised however the writer reports them, described in one line


def write_errors() -> tuple[type[BaseException], ...]:
    """The exception types of a failed write.

    OSError from Python, RuntimeError from torch.save's writer, SafetensorError, and torch.distributed.checkpoint's
    CheckpointException (FSDP's sharded save; a BaseException, not an Exception).
    """
    errors: tuple[type[BaseException], ...] = (OSError, RuntimeError)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:  # older safetensors: its error is not exported
        pass
    try:
        from torch.distributed.checkpoint.api import CheckpointException

        errors += (CheckpointException,)
    except ImportError:  # torch built without distributed
        pass
    return errors


def is_write_failure(error: BaseException) -> bool:
    """True for an error that says a write failed for a reason outside the code (not bad input, not a bug).

    Each writer says it its own way (seen on a full tmpfs): Python's OSError with ENOSPC, numpy's errno-less OSError
    ("100000 requested and 0 written"), torch.save's RuntimeError ("unexpected pos 576 vs 534", "PytorchStreamWriter
    failed writing file"), safetensors' SafetensorError ("I/O error: No space left on device (os error 28)").
    """
    if isinstance(error, OSError):
        return error.errno in WRITE_ERRNOS or (error.errno is None and "written" in str(error))
    text = str(error)
    if type(error).__name__ == "SafetensorError":
        return "I/O error" in text or "os error" in text
    if isinstance(error, RuntimeError):
        return any(sign in text for sign in ("unexpected pos", "PytorchStreamWriter", "file write failed"))
    return False


def describe_write_error(error: BaseException, where: Path) -> str:
    """One line: the error and, when the disk is nearly full, how much space is left."""
    failures = getattr(error, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        _, (error, _) = next(iter(sorted(failures.items())))
    text = (error.strerror if isinstance(error, OSError) and error.strerror else str(error)).splitlines()[0]
    try:
        free = shutil.disk_usage(next(p for p in (where, *where.parents) if p.exists())).free
        if free < 2**20:
            text = f"the disk is full ({free} bytes free): {text}"
        elif free < 2**30:
            text += f" ({free / 2**20:.1f} MiB free on that disk)"
    except OSError:
        pass
    return text


@contextmanager
def stop_on_write_failure(path: str | Path, kept: str = "") -> Iterator[None]:
    """Turn a failed write in the block into `WriteFailed` (exit 74): one line naming `path`, no traceback.

    Args:
        path: What the block writes (a file or a directory), named in the message.
        kept: What is intact and what to do next, appended to the message (default: `path` is as it was).

    Raises:
        WriteFailed: the block's write failed (`is_write_failure`); other errors pass through unchanged.
    """
    try:
        yield
    except WriteFailed:
        raise  # an inner write already named its path
    except BaseException as e:
        if not is_write_failure(e):
            raise
        raise _write_failed(Path(path), describe_write_error(e, Path(path)), kept=kept) from None


def unnamed_write_failure(error: BaseException) -> WriteFailed:
    """The WriteFailed of a failed write that no writer above named (a folder made, a file appended).

    It names the file the error itself names, if any.
    """
    filename = getattr(error, "filename", None)
    what = f"cannot write {filename}" if filename else "a write failed"
    return WriteFailed(f"{what}: {describe_write_error(error, Path(filename or '.'))}")


def _write_failed(path: Path, detail: str, part: str = "", kept: str = "") -> WriteFailed:
    """The one-line WriteFailed of `path` (its `part`, a file in it, named in brackets), path and detail attached."""
    error = WriteFailed(f"cannot write {path}{part}: {detail}; {kept or f'{path} is as it was'}")
    error.path, error.detail = path, detail
    return error


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
