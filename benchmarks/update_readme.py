"""Copy measured tables into README.md: every block between
``<!-- BEGIN path -->`` and ``<!-- END path -->`` is replaced by the file at `path`, so the README
only ever shows tables that a script in this repository wrote.

    python benchmarks/update_readme.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- BEGIN (\S+) -->\n)(.*?)(<!-- END \2 -->)", re.S)


def update(readme: Path = ROOT / "README.md") -> list[str]:
    text = readme.read_text()
    missing = []

    def fill(match):
        source = ROOT / match.group(2)
        if not source.exists():
            missing.append(match.group(2))
            return match.group(0)
        return match.group(1) + source.read_text().rstrip("\n") + "\n" + match.group(4)

    new = BLOCK.sub(fill, text)
    if new != text:
        tmp = readme.with_suffix(".md.tmp")
        tmp.write_text(new)
        tmp.replace(readme)
    return missing


if __name__ == "__main__":
    missing = update()
    for path in missing:
        print(f"not yet measured (run its script first): {path}", file=sys.stderr)
    sys.exit(1 if missing else 0)
