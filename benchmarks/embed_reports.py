"""Embed generated reports and tables into the Markdown pages that show them.

A page marks each embedded file with a pair of comments::

    <!-- BEGIN benchmarks/results/core.md -->
    (the file's text, replaced on every run)
    <!-- END benchmarks/results/core.md -->

Every block is replaced by the current text of the file it names (paths from the repository
root), so a page only ever shows numbers that a script or the pipeline wrote. Headings inside an
embedded file are moved down to sit one level below the heading that encloses the block: a report
that starts with its own `# title` becomes a subsection, and the page keeps one outline.

    python benchmarks/embed_reports.py            # refresh README.md and docs/*.md
    python benchmarks/embed_reports.py --check    # exit 1 if a page is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- BEGIN (\S+) -->\n)(.*?)(<!-- END \2 -->)", re.S)
HEADING = re.compile(r"^(#{1,6})(?= )")
FENCE = re.compile(r"^(```|~~~)")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may embed files: the README and the documentation."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def heading_levels(lines: list[str]) -> list[int]:
    """For each line, the level of its Markdown heading (0: not a heading; fenced code skipped)."""
    levels, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        levels.append(len(match.group(1)) if match else 0)
    return levels


def nest(text: str, parent_level: int) -> str:
    """`text` with its headings moved so that the highest sits at `parent_level + 1` and none is
    more than one level below the heading before it (a report that skips a level still nests)."""
    lines = text.split("\n")
    levels = heading_levels(lines)
    used = [level for level in levels if level]
    if not used:
        return text
    shift = parent_level + 1 - min(used)
    previous = parent_level
    for i, level in enumerate(levels):
        if level:
            new = min(level + shift, previous + 1, 6)
            lines[i] = "#" * new + lines[i][level:]
            previous = new
    return "\n".join(lines)


def embed(page: Path, root: Path = ROOT) -> tuple[str, list[str]]:
    """The page's text with every block refreshed, and the embedded paths that do not exist."""
    text = page.read_text()
    missing = []

    def fill(match: re.Match) -> str:
        source = root / match.group(2)
        if not source.is_file():
            missing.append(match.group(2))
            return match.group(0)
        above = heading_levels(text[: match.start()].split("\n"))
        parent = next((level for level in reversed(above) if level), 0)
        body = nest(source.read_text().rstrip("\n"), parent)
        return match.group(1) + body + "\n" + match.group(4)

    return BLOCK.sub(fill, text), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page differs from its embedded files")
    args = parser.parse_args(argv)
    stale, missing = [], []
    for page in pages():
        new, gone = embed(page)
        missing += [f"{page.relative_to(ROOT)}: {path}" for path in gone]
        if new == page.read_text():
            continue
        stale.append(str(page.relative_to(ROOT)))
        if not args.check:
            tmp = page.with_name(page.name + ".tmp")  # temp file, then rename: never half-written
            tmp.write_text(new)
            tmp.replace(page)
    for line in missing:
        print(f"embedded file not found (run the script that writes it): {line}", file=sys.stderr)
    if args.check and stale:
        print("out of date (run python benchmarks/embed_reports.py): " + ", ".join(stale),
              file=sys.stderr)
    elif stale:
        print("refreshed: " + ", ".join(stale))
    return 1 if missing or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
