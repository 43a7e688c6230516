"""Training drafts for a target: its own replies to many prompts (`replies`, from template and
self-written prompts, generated in batches by `reply_generation`), a distilled standalone draft
(`distill`) and an EAGLE-3 head (`eagle3_init`, `eagle3_step`, `eagle3_train`)."""
