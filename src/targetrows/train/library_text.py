"""Text the target did not write, for labelled training positions: functions and classes from
the source of Python's standard library (code with its docstrings and comments).

A passage given as a user's message is labelled at every position of one batched prefill
(`replies.teacher_data` with ``learn_prompts``), then gets a short greedy reply. The passages are
text written by people, not by templates or by the target, so a head trained on them meets
wordings, identifiers and code that no training prompt holds. (A batched prefill is not much
cheaper per labelled position than batched generation: docs/measurements.md.) Every machine
that runs this package has them; they depend on the Python version (its standard library), so
a head trained with them is reproducible on the same version.

The test suite, IDLE, lib2to3, codec tables and installed packages are left out. Files are
visited in a seeded order, at most `per_file` passages from each, so the passages spread over
the library instead of crowding into its largest modules.
"""

from __future__ import annotations

import ast
import io
import random
import sysconfig
from pathlib import Path

# tests, tools, installed packages, and codec tables (hundreds of near-identical modules)
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo",
                          "encodings", "__pycache__"})


def library_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files (sorted), without its tests, tools and installed
    packages."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else Path(root)
    files = [f for f in root.rglob("*.py")
             if not SKIPPED_DIRS.intersection(f.relative_to(root).parts[:-1])]
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}: this Python ships its standard "
                                "library compiled only; use --library-passages 0")
    return sorted(files)


def file_passages(path: Path, min_chars: int, max_chars: int) -> list[str]:
    """The file's functions and classes (outermost first, as `ast.walk` meets them), each cut
    to `max_chars`; shorter than `min_chars` left out. A file that does not parse gives none."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    # split once (ast.get_source_segment splits per node), at line ends only, as ast counts
    # lines: str.splitlines would also split at the form feeds some modules hold
    lines = io.StringIO(source, newline="").readlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # from the def (or class) line, decorators left out, to the body's last line
            text = "".join(lines[node.lineno - 1 : node.end_lineno]).strip("\n")
            if len(text) >= min_chars:
                out.append(text[:max_chars])
    return out


def library_passages(n: int, seed: int = 0, per_file: int = 4, min_chars: int = 200,
                     max_chars: int = 700, root: Path | None = None) -> list[str]:
    """`n` distinct passages (fewer if the library holds fewer): files in a seeded order, up to
    `per_file` passages drawn from each. The same arguments on the same Python give the same
    list."""
    if n < 0:
        raise ValueError(f"--library-passages {n} must be at least 0")
    rng = random.Random(seed)
    files = library_files(root)
    rng.shuffle(files)
    out: list[str] = []
    seen: set[str] = set()
    for path in files:
        if len(out) >= n:
            break
        found = [p for p in file_passages(path, min_chars, max_chars) if p not in seen]
        for text in rng.sample(found, min(per_file, len(found), n - len(out))):
            seen.add(text)
            out.append(text)
    return out
