# Learned rerankers: the learned rules' models, fitted on the row logs of every task of one
# pair x temperature and cross-fitted by prompt (each prompt is scored, offline and online, by
# a model trained without it). NumPy only, seconds.


rule train_reranker:
    input:
        rerank_inputs,
    output:
        models=expand("results/rerankers/{{pair}}/T{{temperature}}/{name}.json", name=LEARNED_RULES),
        report="results/rerankers/{pair}/T{temperature}/report.md",
        report_csv="results/rerankers/{pair}/T{temperature}/report.csv",
    log:
        "results/logs/rerankers/{pair}/T{temperature}.log",
    priority: PRIORITY["train_reranker"]
    localrule: True
    conda:
        ENV
    params:
        command=lambda w, input, output: [
            "train-reranker",
            *input,
            "--rules",
            *LEARNED_RULES,
            "--budgets",
            *config["score"]["budgets"],
            "--folds",
            config["rerank"]["folds"],
            "--seed",
            config["rerank"]["seed"],
            "--out",
            str(Path(output.report).parent),
        ],
    script:
        "../scripts/targetrows_command.py"
