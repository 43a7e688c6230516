"""Snakemake job: one decoder on one target x task x temperature, all its budget conditions.

Resolves the conditions (a matched cap from the baseline's runs and the row logs:
`targetrows.pipeline.conditions`) and writes them beside the answers, claims its GPUs and calls
`targetrows decode`, which resumes an interrupted job from OUT.partial and writes OUT atomically.
"""

import json
import sys

from targetrows.decoding.registry import get_decoder
from targetrows.pipeline.conditions import resolve, write_conditions
from targetrows.pipeline.gpu_lock import run_claimed
from targetrows.rowlog import format as rowlog


def command(smk, budgets: list[int]):
    # ar verifies no tree: it runs once, and its answers say budget 0
    budget_args = ["--budgets", *map(str, budgets)] if get_decoder(smk.wildcards.decoder).drafts else []
    reranker = ["--reranker", *smk.input.reranker] if "reranker" in smk.input.keys() else []

    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "decode",
            "--target", smk.input.target, "--draft", smk.input.draft,
            "--target-device", target_device, "--draft-device", draft_device,
            "--dtype", smk.params.dtype,
            "--prompts", smk.input.prompts, "--decoder", smk.wildcards.decoder,
            *budget_args, "--temperature", smk.wildcards.temperature,
            "--max-new-tokens", str(smk.params.max_new_tokens), "--seed", str(smk.params.seed),
            "--top-k", str(smk.params.top_k), "--depth", str(smk.params.depth),
            "--model-id", smk.wildcards.target, "--no-progress",
            *reranker, *smk.params.trust, *smk.params.args, "--out", smk.output.answers,
        ]
    return argv


def main(smk) -> None:
    decoder, specs = smk.wildcards.decoder, smk.params.budgets
    baseline, logs = [], []
    if "baseline" in smk.input.keys():
        for path in smk.input.baseline:
            with open(path, encoding="utf-8") as f:
                baseline += [json.loads(line) for line in f]
        logs = [rowlog.read(p) for p in smk.input.rows]
    conditions = resolve(decoder, specs, baseline, logs)
    with open(smk.log[0], "w") as log:
        for c in conditions:
            print(f"{decoder} condition {c['condition']}: {c['spec']} -> budget {c['budget']}"
                  + (f" (baseline {c['baseline']} at {c['baseline_budget']}: "
                     f"{c['baseline_mean_nodes']:.2f} mean nodes; this rule's trees at the cap: "
                     f"{c['rule_mean_nodes']:.2f})" if "baseline_mean_nodes" in c else ""),
                  file=log)
    budgets = list(dict.fromkeys(c["budget"] for c in conditions))
    rc = run_claimed(command(smk, budgets), smk.resources.gpu, smk.log[0],
                     smk.params.lock_dir or None)
    if rc:
        sys.exit(f"targetrows decode failed with status {rc}; see {smk.log[0]}")
    write_conditions(smk.output.conditions, decoder, conditions)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
