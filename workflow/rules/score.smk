# Scoring: every rule at every budget on one row log (NumPy only, seconds), into a tidy table;
# the learned rules with their rerankers (rules/rerank.smk).


rule score:
    input:
        rows="results/rows/{pair}/{task}/T{temperature}.npz",
        rerankers=reranker_files,
    output:
        "results/scores/{pair}/{task}/T{temperature}.csv",
    log:
        "results/logs/scores/{pair}/{task}/T{temperature}.log",
    localrule: True
    conda:
        ENV
    params:
        command=lambda w, input, output: [
            "score",
            input.rows,
            "--pair",
            w.pair,
            "--budgets",
            *config["score"]["budgets"],
            *(["--reranker", *input.rerankers] if input.rerankers else []),
            "--out",
            output[0],
        ],
    script:
        "../scripts/targetrows_command.py"
