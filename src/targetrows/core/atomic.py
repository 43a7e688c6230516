"""Writing files and folders so that nothing is ever half-written: a temp file (or folder)
beside the target, fsync, then one rename. A reader sees the old one or the complete new one,
never a torn one."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to write that appears under `path` only once the block ends without error."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, _temp_name(name, f"{os.getpid()}-{secrets.token_hex(4)}"))
    try:
        with open(tmp, "xb") as f:  # default permissions (mkstemp's are owner-only)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _temp_name(name: str, tag: str) -> str:
    return f".{name}.{tag}.tmp"


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Delete the temp files that writers of `path` killed by SIGKILL left beside it (no cleanup
    runs then); returns their paths. Call it only where this process alone writes `path`, as a
    job that owns its output does before it starts."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    stale = re.compile(re.escape(_temp_name(name, "@")).replace("@", r"\d+-[0-9a-f]{8}") + "$")
    try:
        found = [os.path.join(folder, f) for f in os.listdir(folder) if stale.match(f)]
    except FileNotFoundError:
        return []
    for f in found:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f)
    return found


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def replace_folder(tmp: Path, out: Path, force: bool) -> None:
    """Move the finished `tmp` folder to `out`, replacing an old `out` only when `force`."""
    # mkdtemp and safetensors create private (0700/0600) entries; models are meant to be shared
    os.chmod(tmp, 0o755)
    for path in tmp.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


@contextlib.contextmanager
def new_folder(out: Path, force: bool):
    """Yield a temporary folder beside `out` to fill; on success it becomes `out` (replacing an
    old one only when `force`), on an error it is removed: `out` is never half-written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        replace_folder(tmp, out, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
