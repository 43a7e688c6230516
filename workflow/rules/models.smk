# Model folders under resources/models/: downloaded from the hub (models and EAGLE-3 heads), or
# built offline (the embedded SmolLM2 target from its PyPI wheel; standalone drafts distilled
# from a target and EAGLE-3 heads trained for it, both from the target's replies under
# resources/replies/). Local models and heads are used where they are and have no rule. The
# replies and the heads are made on the GPUs the jobs claim where there are any (the target's
# cards for the replies, one card for a head), else on the CPU.


rule download_model:
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    wildcard_constraints:
        model=alternation(models_from("hub") + hub_heads()),
    localrule: True  # compute nodes of a cluster often have no internet
    conda:
        ENV
    params:
        repo=lambda w: config["models"][w.model]["repo"],
        revision=lambda w: config["models"][w.model]["revision"],
        gated=lambda w: config["models"][w.model]["gated"],
        head=lambda w: config["models"][w.model]["source"] == "eagle3",
    script:
        "../scripts/download_model.py"


rule build_target:
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    wildcard_constraints:
        model=alternation(models_from("embedded")),
    conda:
        ENV
    threads: config["threads"]["build"]
    resources:
        mem_mb=job_mem_mb("build_target"),
        runtime=job_runtime("build_target"),
    params:
        command=lambda w, output: [
            "build-target",
            "--out",
            output[0],
            "--wheel-cache",
            "resources/wheels",
            *config["models"][w.model]["args"],
        ],
    script:
        "../scripts/targetrows_command.py"


rule target_replies:
    input:
        target=lambda w: model_dir(w.target),
    output:
        directory("resources/replies/{target}"),
    log:
        "results/logs/replies/{target}.log",
    benchmark:
        "results/benchmarks/replies/{target}.tsv"
    wildcard_constraints:
        target=alternation(trained_from()),
    conda:
        ENV
    threads: config["threads"]["build"]
    resources:
        gpu=lambda w: gpu_request(replies_placement(w.target).gpus),
        mem_mb=lambda w, input: job_mem_mb("target_replies", [input.target]),
        runtime=job_runtime("target_replies"),
    params:
        lock_dir=gpu_lock_dir(),
        placement=lambda w: replies_placement(w.target),
        command=lambda w, input, output, threads: [
            "replies",
            "--target",
            input.target,
            "--out",
            output[0],
            "--threads",
            threads,
            *replies_args(),
            *chat_args(w.target),
        ],
    script:
        "../scripts/train_on_gpus.py"


rule distill_draft:
    input:
        target=lambda w: model_dir(config["models"][w.model]["target"]),
        replies=lambda w: replies_dir(w.model),
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    wildcard_constraints:
        model=alternation(models_from("distill")),
    conda:
        ENV
    threads: config["threads"]["build"]
    resources:
        mem_mb=lambda w, input: job_mem_mb("distill_draft", [input.target, input.replies]),
        runtime=job_runtime("distill_draft"),
    params:
        command=lambda w, input, output, threads: [
            "distill",
            "--target",
            input.target,
            "--replies",
            input.replies,
            "--out",
            output[0],
            "--seed",
            config["models"][w.model]["seed"],
            "--threads",
            threads,
            *config["models"][w.model]["args"],
        ],
    script:
        "../scripts/targetrows_command.py"


rule train_eagle3:
    input:
        target=lambda w: model_dir(config["models"][w.model]["target"]),
        replies=lambda w: replies_dir(w.model),
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    wildcard_constraints:
        model=alternation(models_from("train_eagle3")),
    conda:
        ENV
    threads: config["threads"]["build"]
    resources:
        gpu=gpu_request(TRAIN_PLACEMENT.gpus),
        mem_mb=lambda w, input: job_mem_mb("train_eagle3", [input.target, input.replies]),
        runtime=job_runtime("train_eagle3"),
    params:
        lock_dir=gpu_lock_dir(),
        placement=TRAIN_PLACEMENT,
        command=lambda w, input, output, threads: [
            "train-eagle3",
            "--target",
            input.target,
            "--replies",
            input.replies,
            "--out",
            output[0],
            "--seed",
            config["models"][w.model]["seed"],
            "--threads",
            threads,
            *config["models"][w.model]["args"],
        ],
    script:
        "../scripts/train_on_gpus.py"
