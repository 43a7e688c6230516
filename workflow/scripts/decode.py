"""Snakemake job: one decoder on one pair x temperature, every task, all its budget conditions.

Resolves the conditions (a matched cap from the baseline's runs and the row logs:
`targetrows.pipeline.conditions`), claims its GPUs and calls `targetrows decode` once for every
task's prompts (the models load once; an `auto` condition is picked once, on this machine),
which resumes an interrupted job from OUT.partial and writes each OUT atomically. Then writes
the conditions, with the `auto` choice read back from the answers.
"""

import sys

from targetrows.decoding.budget import Auto, Fixed, parse_budget
from targetrows.decoding.registry import get_decoder
from targetrows.pipeline.conditions import fill_auto, resolve, write_conditions
from targetrows.pipeline.gpu_lock import run_job
from targetrows.rowlog import format as rowlog
from targetrows.specbench.answers import read_answers


def budgets_of(decoder: str, conditions: list[dict]) -> list:
    """The conditions as `targetrows decode --budgets` takes them: each one's resolved cap, or
    auto; none for a decoder that verifies no tree (ar runs once; its answers say budget 0)."""
    if not get_decoder(decoder).drafts:
        return []
    return list(dict.fromkeys(Auto() if c["budget"] is None else Fixed(c["budget"])
                              for c in conditions))


def command(smk, budgets: list, devices: dict):
    """The job's `targetrows decode` command line, given the devices it got (which it notes in
    `devices`, for the conditions file)."""
    budget_args = ["--budgets", *map(str, budgets)] if budgets else []
    reranker = ["--reranker", *smk.input.reranker] if "reranker" in smk.input.keys() else []
    # a draft-free decoder's job has no draft, so nothing for prompt lookup to mix into
    draft = ["--draft", smk.input.draft] if "draft" in smk.input.keys() else []
    extra = [a for a in smk.params.args if draft or a != "--draft-lookup"]

    def argv(target_device: str, draft_device: str) -> list[str]:
        devices.update(target=target_device, draft=draft_device)
        return [
            sys.executable, "-m", "targetrows.cli", "decode",
            "--target", smk.input.target, *draft,
            "--target-device", target_device, "--draft-device", draft_device,
            "--dtype", smk.params.dtype,
            "--prompts", *smk.input.prompts, "--decoder", smk.wildcards.decoder,
            *budget_args, "--temperature", smk.wildcards.temperature,
            "--max-new-tokens", str(smk.params.max_new_tokens), "--seed", str(smk.params.seed),
            "--batch-size", str(smk.params.batch_size),
            "--top-k", str(smk.params.top_k), "--depth", str(smk.params.depth),
            "--model-id", smk.wildcards.pair, "--no-progress",
            *reranker, *smk.params.graphs, *smk.params.trust, *smk.params.chat, *extra,
            "--out", *smk.output.answers,
        ]
    return argv


def describe(decoder: str, c: dict) -> str:
    if isinstance(parse_budget(c["spec"]), Auto):
        return f"{decoder} condition {c['condition']}: auto (picked by targetrows decode)"
    line = f"{decoder} condition {c['condition']}: {c['spec']} -> budget {c['budget']}"
    if "baseline_mean_nodes" in c:
        line += (f" (baseline {c['baseline']} at {c['baseline_budget']}: "
                 f"{c['baseline_mean_nodes']:.2f} mean nodes; this rule's trees at the cap: "
                 f"{c['rule_mean_nodes']:.2f})")
    return line


def main(smk) -> None:
    decoder = smk.wildcards.decoder
    baseline, logs = [], []
    if "baseline" in smk.input.keys():
        baseline = read_answers(list(smk.input.baseline))
        logs = [rowlog.read(p) for p in smk.input.rows]
    conditions = resolve(decoder, smk.params.budgets, smk.params.depth, baseline, logs)
    with open(smk.log[0], "w") as log:
        for c in conditions:
            print(describe(decoder, c), file=log)
    budgets, devices = budgets_of(decoder, conditions), {}
    run_job(smk, command(smk, budgets, devices), "decode", fresh_log=False)  # after the conditions
    conditions = fill_auto(conditions, read_answers(list(smk.output.answers)))
    write_conditions(smk.output.conditions, smk.wildcards.pair,
                     float(smk.wildcards.temperature), decoder, conditions, devices)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
