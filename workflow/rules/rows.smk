# Row logs: the target decodes each prompt alone and its rows on the draft's candidate pools are
# recorded, one row log per pair x task x temperature, so every rule and budget is scored on
# the same rows (rules/score.smk). One job per pair x temperature records every task (the
# models load once).


rule record_rows:
    input:
        unpack(pair_inputs),
    output:
        expand("results/rows/{{pair}}/{task}/T{{temperature}}.npz", task=config["tasks"]),
    log:
        "results/logs/rows/{pair}/T{temperature}.log",
    benchmark:
        "results/benchmarks/rows/{pair}/T{temperature}.tsv"
    priority: PRIORITY["record_rows"]
    conda:
        ENV
    threads: config["threads"]["record"]
    resources:
        gpu=lambda w: gpu_request(placement_for(w.pair, None, config["record"]["dtype"]).gpus),
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
        trust=lambda w: trust_args(w.pair),
        chat=lambda w: chat_args(target_of(w.pair)),
        lock_dir=gpu_lock_dir(),
        placement=lambda w: placement_for(w.pair, None, config["record"]["dtype"]),
    script:
        "../scripts/record.py"
