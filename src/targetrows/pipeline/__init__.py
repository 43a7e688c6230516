"""What the Snakemake jobs call: GPU claims for local runs, and the command lines of the pipeline's jobs."""
