# Part times: one job per target, on the GPUs a decode job of its pair takes, timing what the
# decode jobs are made of there (`targetrows part-times`): the pair's passes, the prefill of the
# longest prompt a turn may have, the prompt turns and the load. Each decode job's wall-time
# request is worked out from it (resources.runtime.decode: auto, the default).


rule part_times:
    input:
        target=lambda w: model_dir(w.target),
        draft=lambda w: model_dir(DRAFT_OF[w.target]),
        prompts=[prompts_file(task) for task in config["tasks"]],
    output:
        "results/parts/{target}.json",
    log:
        "results/logs/parts/{target}.log",
    conda:
        ENV
    threads: config["threads"]["decode"]
    resources:
        gpu=lambda w: gpu_request(placement_for(w.target, None, config["decode"]["dtype"]).gpus),
        mem_mb=lambda w, input: job_mem_mb("part_times", [input.target, input.draft]),
        runtime=job_runtime("part_times"),
    params:
        dtype=config["decode"]["dtype"],
        max_new_tokens=config["decode"]["max_new_tokens"],
        budgets=lambda w: timed_budgets(),
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        trust=lambda w: trust_args(w.target),
        chat=lambda w: chat_args(w.target),
        lock_dir=gpu_lock_dir(),
        placement=lambda w: placement_for(w.target, None, config["decode"]["dtype"]),
    script:
        "../scripts/part_times.py"
