# Scoring: every rule at every budget on one row log (NumPy only, seconds), into a tidy table.


rule score:
    input:
        "results/rows/{target}/{task}/T{temperature}.npz",
    output:
        "results/scores/{target}/{task}/T{temperature}.csv",
    log:
        "results/logs/scores/{target}/{task}/T{temperature}.log",
    params:
        budgets=config["score"]["budgets"],
    localrule: True
    conda:
        ENV
    shell:
        "targetrows score {input:q} --pair {wildcards.target} --budgets {params.budgets} "
        "--out {output:q} > {log:q} 2>&1"
