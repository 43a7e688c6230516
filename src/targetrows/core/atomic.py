"""Writing files so that nothing is ever half-written: a temp file beside the target, fsync,
then one rename. A reader sees the old file or the complete new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
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
