# Row logs: the target decodes each prompt alone and its rows on the draft's candidate pools are
# recorded once per target x task x temperature, so every rule and budget is scored on the same
# rows (rules/score.smk).


rule record_rows:
    input:
        unpack(pair_inputs),
    output:
        "results/rows/{target}/{task}/T{temperature}.npz",
    log:
        "results/logs/rows/{target}/{task}/T{temperature}.log",
    benchmark:
        "results/benchmarks/rows/{target}/{task}/T{temperature}.tsv"
    params:
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        stride=config["record"]["stride"],
        max_new_tokens=config["record"]["max_new_tokens"],
        seed=config["record"]["seed"],
        dtype=config["record"]["dtype"],
        args=config["record"]["args"],
        trust=lambda w: trust_args(w.target),
        lock_dir=gpu_lock_dir(),
    threads: config["threads"]["record"]
    resources:
        gpu=gpu_request(1),
        mem_mb=lambda w, input: job_mem_mb("record_rows", [input.target, input.draft]),
        runtime=job_runtime("record_rows"),
    conda:
        ENV
    script:
        "../scripts/record.py"
