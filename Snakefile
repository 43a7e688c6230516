# targetrows reproducibility pipeline: models and prompts -> online decoding -> row logs ->
# scores -> tables and figures under results/. config/README.md explains the configuration.
#   snakemake --cores all                                   # default: embedded pair, CPU
#   snakemake --cores all --resources gpu=2 --configfile config/paper.yaml
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/agreement.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/parts.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/rows.smk"
include: "workflow/rules/drift.smk"
include: "workflow/rules/rerank.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/claims.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
    localrule: True
