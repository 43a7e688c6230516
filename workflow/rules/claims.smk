# The paper's claims, one by one: the exact-reuse table from the toy pair and every row log,
# then results/claims.md and .csv, each claim judged on this run's tidy tables (docs/claims.md).


rule reuse:
    input:
        rows=[log for _, log in row_logs()],
    output:
        csv="results/tables/reuse.csv",
        md="results/tables/reuse.md",
        tex="results/tables/reuse.tex",
    log:
        "results/logs/summary/reuse.log",
    localrule: True
    conda:
        ENV
    params:
        pairs=[pair for pair, _ in row_logs()],
        temperatures=[float(t) for t in TEMPERATURES],
        bootstrap=config["report"]["bootstrap"],
        seed=config["report"]["seed"],
    script:
        "../scripts/reuse.py"


rule claims:
    input:
        expand("results/tables/{name}.csv", name=CLAIM_TABLES),
    output:
        md="results/claims.md",
        csv="results/claims.csv",
    log:
        "results/logs/summary/claims.log",
    localrule: True
    conda:
        ENV
    script:
        "../scripts/claims.py"
