"""Where a pipeline run's time went: Snakemake's own job timings (results/benchmarks/**/*.tsv,
written for every rule that has a `benchmark:`), summed per rule, beside the run's wall time.

    /usr/bin/time -f %e -o wall.txt .venv/bin/snakemake --cores all
    python benchmarks/pipeline_times.py --run . --wall "$(cat wall.txt)" \
        --command "snakemake --cores all" --out benchmarks/results/pipeline_times.md

The rules' sums add up to more than the wall time wherever jobs ran side by side (two at a time
on two cores); the head's build (replies, then training) runs alone and is most of the path.
The report names the CPU, the instruction set torch's kernels use and the dtype `dtype: auto`
picks, as this script sees them: run it with the environment the run had (ATEN_CPU_CAPABILITY
and ONEDNN_MAX_CPU_ISA when they held the run to AVX2). It ends with the run's draft-agreement
tables (results/tables/draft_agreement_*.md): what the head that run trained reaches.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path

from report_out import emit

# the folder under results/benchmarks/ -> the rule that wrote it
RULES = {"replies": "target_replies", "decode": "decode", "rows": "record_rows",
         "agreement": "draft_agreement"}


def job_seconds(run: Path) -> dict[str, list[tuple[str, float]]]:
    """{benchmark folder: [(job, wall seconds)]} of one run."""
    out = defaultdict(list)
    root = run / "results" / "benchmarks"
    for tsv in sorted(root.rglob("*.tsv")):
        with open(tsv) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if rows:
            folder = tsv.relative_to(root).parts[0]
            out[folder].append((str(tsv.relative_to(root).with_suffix("")), float(rows[-1]["s"])))
    if not out:
        raise SystemExit(f"no job timings under {root}: run the pipeline there first")
    return dict(out)


def cpu_line() -> str:
    """The CPU's name, the instruction set torch's CPU kernels run at (ATEN_CPU_CAPABILITY can
    hold it below the CPU's) and the dtype that `dtype: auto` gives the target on it."""
    name = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), name)
    try:
        import torch

        from targetrows.hf.loading import resolve_dtype
    except ImportError:
        return f"- CPU: {name}"
    dtype = str(resolve_dtype("auto", "cpu")).removeprefix("torch.")
    return (f"- CPU: {name}; torch kernels at {torch.backends.cpu.get_cpu_capability()}; "
            f"`dtype: auto` runs {dtype}")


def decode_split(times: list[tuple[str, float]]) -> list[str]:
    """The decode jobs of the prior-art decoders (the registry's `prior_art`) and of the rest,
    each job named .../<decoder> by its benchmark file: what comparing with them costs."""
    from targetrows.decoding.registry import prior_art_decoders

    prior = set(prior_art_decoders())
    lines = []
    for label, pick in ((f"decode: {', '.join(sorted(prior))}", True), ("decode: the rest", False)):
        secs = [s for name, s in times if (name.rsplit("/", 1)[-1] in prior) == pick]
        if secs:
            lines.append(f"| {label} | {len(secs)} | {sum(secs) / 60:.1f} | "
                         f"{max(secs) / 60:.1f} |")
    return lines


def agreement_tables(run: Path) -> list[str]:
    """The run's draft-agreement tables, each under the head's name."""
    lines = []
    for table in sorted((run / "results" / "tables").glob("draft_agreement_*.md")):
        head = table.stem.removeprefix("draft_agreement_")
        lines += ["", f"The head {head}'s agreement with the target "
                  f"(results/tables/{table.name}):", "", table.read_text().rstrip()]
    return lines


def report(run: Path, wall: float | None, command: str) -> str:
    jobs = job_seconds(run)
    lines = [f"- command: `{command or '(not given)'}`",
             f"- machine: {platform.platform()}, {len(os.sched_getaffinity(0))} CPUs",
             cpu_line()]
    if wall:
        lines.append(f"- wall time of the whole run: {wall / 60:.1f} minutes")
    lines += ["", "| stage | jobs | minutes, all jobs | minutes, longest job |",
              "|---|---|---|---|"]
    order = ["models", "replies", "rows", "decode", "agreement"]
    for folder in sorted(jobs, key=lambda f: order.index(f) if f in order else len(order)):
        times = jobs[folder]
        if folder == "models":  # one line per model built
            for name, s in times:
                lines.append(f"| build {name.split('/', 1)[1]} | 1 | {s / 60:.1f} | "
                             f"{s / 60:.1f} |")
            continue
        secs = [s for _, s in times]
        lines.append(f"| {RULES.get(folder, folder)} | {len(secs)} | {sum(secs) / 60:.1f} | "
                     f"{max(secs) / 60:.1f} |")
        if folder == "decode":
            lines += decode_split(times)
    lines += agreement_tables(run)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=".", help="the pipeline's working directory")
    p.add_argument("--wall", type=float, default=None, help="the run's wall seconds")
    p.add_argument("--command", default="", help="the command that ran, for the report")
    p.add_argument("--out", default=None, help="Markdown file (default: print only)")
    args = p.parse_args(argv)
    text = report(Path(args.run), args.wall, args.command)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
