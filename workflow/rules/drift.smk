# Temperature-0 drift: where each greedy decoder's answers part from ar's, and whether the
# target's rounding explains it (its two best logits there against how far its rows move between
# pass shapes). One job per pair after its temperature-0 decode jobs; it loads the target alone.


rule drift:
    input:
        unpack(drift_inputs),
    output:
        "results/drift/{pair}.csv",
    log:
        "results/logs/drift/{pair}.log",
    conda:
        ENV
    threads: config["threads"]["decode"]
    resources:
        gpu=lambda w: gpu_request(placement_for(w.pair, None, config["decode"]["dtype"]).gpus),
        mem_mb=lambda w, input: job_mem_mb("drift", [input.target]),
        runtime=job_runtime("drift"),
    params:
        dtype=config["decode"]["dtype"],
        trust=lambda w: trust_args(w.pair),
        chat=lambda w: chat_args(target_of(w.pair)),
        lock_dir=gpu_lock_dir(),
        placement=lambda w: placement_for(w.pair, None, config["decode"]["dtype"]),
    script:
        "../scripts/drift.py"
