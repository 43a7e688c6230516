# One prompts file per task in Spec-Bench's question format (question_id, category, turns):
# the bundled prompts of config/prompts/, or each task's dataset (the paper's configuration).


rule prepare_prompts:
    input:
        bundled=lambda w: (
            str(REPO / "config" / "prompts" / f"{w.task}.jsonl")
            if config["prompts"]["source"] == "bundled"
            else []
        ),
    output:
        "resources/prompts/{task}.jsonl",
    log:
        "results/logs/prompts/{task}.log",
    localrule: True  # cheap, and downloads need the internet
    conda:
        ENV
    params:
        source=config["prompts"]["source"],
        n=config["prompts"]["n"],
        seed=config["prompts"]["seed"],
    script:
        "../scripts/prepare_prompts.py"
