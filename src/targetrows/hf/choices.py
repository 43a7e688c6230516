"""The names the model loaders take, without torch: the CLI builds its options from these, so
`targetrows decode --help` and a mistyped option answer at once, not after torch and
transformers have loaded (seconds). `targetrows.hf.loading` and `targetrows.hf.graphs` read
them from here too: one list each."""

# --dtype / --draft-dtype: each name's torch dtype, by its attribute name in torch
# (`targetrows.hf.loading.DTYPES` maps them)
DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "float64": "float64",
    "fp64": "float64",
}

# --trust-remote-code: whose checkpoint code may run (both models, or one of them)
TRUST_CHOICES = ("all", "target", "draft")

# --graphs: padded passes replayed as CUDA graphs where they run, always, or never
GRAPH_MODES = ("auto", "on", "off")
