# Tables and figures under results/: tables (CSV, Markdown, LaTeX) from the score tables and a
# per-prompt summary of the online runs, then figures (PNG, PDF; in `snakemake --report`).


rule summarise_decoding:
    input:
        answers=decode_outputs(),
        conditions=condition_outputs(),
    output:
        online="results/summary/online.csv",
        conditions="results/summary/conditions.csv",
    log:
        "results/logs/summary/online.log",
    localrule: True
    conda:
        ENV
    script:
        "../scripts/summarise_decoding.py"


rule tables:
    input:
        scores=score_outputs(),
        drift=drift_outputs(),
        online="results/summary/online.csv",
        conditions="results/summary/conditions.csv",
    output:
        report(
            expand("results/tables/{name}.csv", name=TABLES),
            caption="../report/tables.rst",
            category="Tables",
        ),
        expand("results/tables/{name}.{ext}", name=TABLES, ext=["md", "tex"]),
    log:
        "results/logs/summary/tables.log",
    localrule: True
    conda:
        ENV
    params:
        bootstrap=config["report"]["bootstrap"],
        seed=config["report"]["seed"],
    script:
        "../scripts/tables.py"


rule figures:
    input:
        accepted="results/tables/expected_accepted.csv",
        gains="results/tables/relative_gains.csv",
        online="results/tables/online.csv",
    output:
        **{
            f"{name}_png": report(
                f"results/figures/{name}.png",
                caption=f"../report/{name}.rst",
                category="Figures",
            )
            for name in FIGURES
        },
        **{f"{name}_pdf": f"results/figures/{name}.pdf" for name in FIGURES},
    log:
        "results/logs/summary/figures.log",
    localrule: True
    conda:
        ENV
    script:
        "../scripts/figures.py"
