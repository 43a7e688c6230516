"""What the Snakemake jobs call: each decode job's budget conditions (`conditions`), and GPU
claims for local runs (`gpu_lock`)."""
