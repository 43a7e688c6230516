# Model folders under resources/models/: downloaded from the hub (models and EAGLE-3 heads), or
# built offline (the embedded SmolLM2 target from its PyPI wheel, and drafts distilled from a
# target). Local models and heads are used where they are and have no rule.


rule download_model:
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    params:
        repo=lambda w: config["models"][w.model]["repo"],
        revision=lambda w: config["models"][w.model].get("revision", "main"),
        gated=lambda w: config["models"][w.model].get("gated", False),
        head=lambda w: config["models"][w.model]["source"] == "eagle3",
    wildcard_constraints:
        model=alternation(models_from("hub") + hub_heads()),
    localrule: True  # compute nodes of a cluster often have no internet
    conda:
        ENV
    script:
        "../scripts/download_model.py"


rule build_target:
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    params:
        command=lambda w, output: [
            "build-target", "--out", output[0], "--wheel-cache", "resources/wheels",
            *config["models"][w.model].get("args", []),
        ],
    wildcard_constraints:
        model=alternation(models_from("embedded")),
    threads: config["threads"]["build"]
    resources:
        mem_mb=job_mem_mb("build_target"),
        runtime=job_runtime("build_target"),
    conda:
        ENV
    script:
        "../scripts/targetrows_command.py"


rule distill_draft:
    input:
        target=lambda w: model_dir(config["models"][w.model]["target"]),
    output:
        directory("resources/models/{model}"),
    log:
        "results/logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    params:
        command=lambda w, input, output, threads: [
            "distill", "--target", input.target, "--out", output[0],
            "--seed", config["models"][w.model].get("seed", 0), "--threads", threads,
            *config["models"][w.model].get("args", []),
        ],
    wildcard_constraints:
        model=alternation(models_from("distill")),
    threads: config["threads"]["build"]
    resources:
        mem_mb=lambda w, input: job_mem_mb("distill_draft", [input.target]),
        runtime=job_runtime("distill_draft"),
    conda:
        ENV
    script:
        "../scripts/targetrows_command.py"
