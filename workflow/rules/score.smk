# Scoring: every rule at every budget on one row log (NumPy only, seconds), into a tidy table.


rule score:
    input:
        "results/rows/{target}/{task}/T{temperature}.npz",
    output:
        "results/scores/{target}/{task}/T{temperature}.csv",
    log:
        "results/logs/scores/{target}/{task}/T{temperature}.log",
    params:
        command=lambda w, input, output: [
            "score", input[0], "--pair", w.target, "--budgets", *config["score"]["budgets"],
            "--out", output[0],
        ],
    localrule: True
    conda:
        ENV
    script:
        "../scripts/targetrows_command.py"
