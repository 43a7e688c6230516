# How often each draft the pipeline trains (a distilled draft or an EAGLE-3 head) agrees with its
# target on the task prompts, which its training never reads: online at budget 1 and, for a head,
# teacher-forced with chain acceptance by depth (`targetrows agreement`). Runs on the CPU in
# float32, as the trainings do, so the figures do not depend on the machine.


rule draft_agreement:
    input:
        target=lambda w: model_dir(config["models"][w.model]["target"]),
        draft=lambda w: model_dir(w.model),
        prompts=[prompts_file(task) for task in config["tasks"]],
    output:
        json="results/agreement/{model}.json",
        table="results/tables/draft_agreement_{model}.md",
    log:
        "results/logs/agreement/{model}.log",
    benchmark:
        "results/benchmarks/agreement/{model}.tsv"
    wildcard_constraints:
        model=alternation(trained_drafts()),
    priority: PRIORITY["draft_agreement"]
    conda:
        ENV
    threads: config["threads"]["build"]
    resources:
        mem_mb=lambda w, input: job_mem_mb("draft_agreement", [input.target, input.draft]),
    params:
        command=lambda w, input, output, threads: [
            "agreement",
            "--target",
            input.target,
            "--draft",
            input.draft,
            "--prompts",
            *input.prompts,
            "--threads",
            threads,
            "--json",
            output.json,
            "--table",
            output.table,
            *chat_args(config["models"][w.model]["target"]),
        ],
    script:
        "../scripts/targetrows_command.py"
