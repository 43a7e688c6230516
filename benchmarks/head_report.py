"""A trained head's own report (`train_eagle3_report.json`, written by `targetrows train-eagle3`)
as a Markdown table (docs/eagle3.md links it).

    python benchmarks/head_report.py resources/models/smollm2-135m-eagle3 \
        --out benchmarks/results/head_report.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from report_out import emit


def table(report: dict, folder: str) -> str:
    chain = report["heldout_chain_acceptance_by_depth"]
    cost = report["forward_cost"]
    rows = [
        ("draft vocabulary (`draft_vocab_size`)", f"{report['draft_vocab_size']:,} tokens"),
        ("reply tokens inside it, training / held-out (`train_coverage`, `heldout_coverage`)",
         f"{report['train_coverage']:.3f} / {report['heldout_coverage']:.3f}"),
        (f"held-out top-1 agreement (`heldout_top1_agreement`, {report['heldout_positions']:,} "
         "positions)", f"{report['heldout_top1_agreement']:.3f}"),
        ("held-out greedy chain right to depth 1, 2, ... (`heldout_chain_acceptance_by_depth`)",
         ", ".join(f"{c:.3f}" for c in chain)),
        ("top-1 agreement on 64 training prompts (`train_top1_agreement`)",
         f"{report['train_top1_agreement']:.3f}"),
        (f"one head step / one cached target step (`forward_cost`, {cost['head_dtype']} head)",
         f"{cost['head_step_ms']:.2f} ms / {cost['target_step_ms']:.1f} ms "
         f"({cost['ratio']:.3f})"),
        ("training data (`train_prompts`, `train_positions`)",
         f"{report['train_prompts']:,} sequences, {report['train_positions']:,} positions"),
        (f"training (`train_seconds`, {report['threads']} threads, {report['train_dtype']} "
         "products)", f"{report['train_seconds'] / 60:.1f} minutes"),
    ]
    lines = [f"`{folder}/train_eagle3_report.json`:", "", "| measure (report key) | value |",
             "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("head", help="a head folder written by targetrows train-eagle3")
    p.add_argument("--out", default=None, help="Markdown file (default: print only)")
    args = p.parse_args(argv)
    path = Path(args.head) / "train_eagle3_report.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no training report (a head trained by targetrows train-eagle3?)")
    text = table(json.loads(path.read_text()), args.head.rstrip("/"))
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
