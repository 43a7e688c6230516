# Row logs: the target decodes each prompt alone and its rows on the draft's candidate pools are
# recorded, one row log per target x task x temperature, so every rule and budget is scored on
# the same rows (rules/score.smk). One job per target x temperature records every task (the
# models load once).


rule record_rows:
    input:
        target=lambda w: model_dir(w.target),
        draft=lambda w: model_dir(DRAFT_OF[w.target]),
        prompts=[prompts_file(task) for task in config["tasks"]],
    output:
        expand("results/rows/{{target}}/{task}/T{{temperature}}.npz", task=config["tasks"]),
    log:
        "results/logs/rows/{target}/T{temperature}.log",
    benchmark:
        "results/benchmarks/rows/{target}/T{temperature}.tsv"
    priority: PRIORITY["record_rows"]
    conda:
        ENV
    threads: config["threads"]["record"]
    resources:
        gpu=lambda w: gpu_request(placement_for(w.target, None, config["record"]["dtype"]).gpus),
        mem_mb=lambda w, input: job_mem_mb("record_rows", [input.target, input.draft]),
        runtime=job_runtime("record_rows"),
    params:
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        stride=config["record"]["stride"],
        max_new_tokens=config["record"]["max_new_tokens"],
        seed=config["record"]["seed"],
        dtype=config["record"]["dtype"],
        args=config["record"]["args"],
        trust=lambda w: trust_args(w.target),
        chat=lambda w: chat_args(w.target),
        lock_dir=gpu_lock_dir(),
        placement=lambda w: placement_for(w.target, None, config["record"]["dtype"]),
    script:
        "../scripts/record.py"
