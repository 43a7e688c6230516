# Part times: one job per pair, on the GPUs a decode job of the pair takes, timing what the
# decode jobs are made of there (`targetrows part-times`): the pair's passes, the prefill of the
# longest prompt a turn may have, the prompt turns and the load. Each decode job's wall-time
# request is worked out from it (resources.runtime.decode: auto, the default).


rule part_times:
    input:
        unpack(pair_inputs),
    output:
        "results/parts/{pair}.json",
    log:
        "results/logs/parts/{pair}.log",
    conda:
        ENV
    threads: config["threads"]["decode"]
    resources:
        gpu=lambda w: gpu_request(placement_for(w.pair, None, config["decode"]["dtype"]).gpus),
        mem_mb=lambda w, input: job_mem_mb("part_times", [input.target, input.draft]),
        runtime=job_runtime("part_times"),
    params:
        dtype=config["decode"]["dtype"],
        graphs=graphs_args(),
        max_new_tokens=config["decode"]["max_new_tokens"],
        budgets=lambda w: timed_budgets(w.pair),
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        trust=lambda w: trust_args(w.pair),
        chat=lambda w: chat_args(target_of(w.pair)),
        lock_dir=gpu_lock_dir(),
        placement=lambda w: placement_for(w.pair, None, config["decode"]["dtype"]),
    script:
        "../scripts/part_times.py"
