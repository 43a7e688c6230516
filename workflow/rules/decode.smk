# Decoding online, one job per pair x temperature x decoder (the pair's decoders) over every
# task's prompts (the models load once, and an `auto` condition is picked once for the pair and
# temperature). The job resolves the decoder's budget conditions (a matched cap from the
# baseline's runs and the row logs, `auto` from the cost model on this machine), runs them one
# after another, writes them to a conditions file and claims its GPUs itself.


rule decode:
    input:
        unpack(decode_inputs),
    output:
        answers=decode_answers(),
        conditions="results/conditions/{pair}/T{temperature}/{decoder}.json",
    log:
        "results/logs/decode/{pair}/T{temperature}/{decoder}.log",
    benchmark:
        "results/benchmarks/decode/{pair}/T{temperature}/{decoder}.tsv"
    priority: lambda w: decode_priority(w.decoder, pair_decoders(w.pair))
    conda:
        ENV
    threads: config["threads"]["decode"]
    resources:
        gpu=lambda w, input: gpu_request(decode_placement(w, input).gpus),
        mem_mb=decode_mem_mb,
        runtime=decode_runtime,
    params:
        budgets=lambda w: decode_budgets(w.decoder),
        max_new_tokens=config["decode"]["max_new_tokens"],
        seed=config["decode"]["seed"],
        dtype=config["decode"]["dtype"],
        batch_size=config["decode"]["batch_size"],
        graphs=graphs_args(),
        top_k=config["pool"]["top_k"],
        depth=config["pool"]["depth"],
        args=config["decode"]["args"],
        trust=lambda w: trust_args(w.pair),
        chat=lambda w: chat_args(target_of(w.pair)),
        lock_dir=gpu_lock_dir(),
        placement=decode_placement,
    script:
        "../scripts/decode.py"
