# Online decoding: one job per target x task x temperature x decoder. The job resolves the
# decoder's budget conditions (a matched cap from the baseline's runs and the row logs), writes
# them beside the answers, runs them one after another (the models load once) and claims its
# GPUs itself.


rule decode:
    input:
        unpack(decode_inputs),
    output:
        answers="results/decode/{target}/{task}/T{temperature}/{decoder}.jsonl",
        conditions="results/decode/{target}/{task}/T{temperature}/{decoder}.conditions.json",
    log:
        "results/logs/decode/{target}/{task}/T{temperature}/{decoder}.log",
    benchmark:
        "results/benchmarks/decode/{target}/{task}/T{temperature}/{decoder}.tsv"
    params:
        budgets=lambda w: decode_budgets(w.decoder),
        max_new_tokens=config["decode"]["max_new_tokens"],
        seed=config["decode"]["seed"],
        dtype=config["decode"]["dtype"],
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        args=config["decode"]["args"],
        trust=lambda w: trust_args(w.target),
        lock_dir=gpu_lock_dir(),
    threads: config["threads"]["decode"]
    resources:
        gpu=lambda w: gpu_request(gpus_for(w.decoder)),
        mem_mb=lambda w, input: job_mem_mb("decode", [input.target, input.draft]),
        runtime=job_runtime("decode"),
    conda:
        ENV
    script:
        "../scripts/decode.py"
