"""Where a pair's models go on a job's GPUs, from the models' sizes and one card's memory.

A target that does not fit one card is spread evenly over as many cards as it needs (Qwen2.5-32B
in bfloat16 holds 66 GB of weights: two 48 GB cards, or one 80 GB card). The draft shares the
target's last card when it fits there, and takes a card of its own only when asked
(`own_draft_card`: the root pass alongside drafting on another device). A job asks Snakemake
and SLURM for exactly `Placement.gpus` GPUs, and runs its models on `Placement.devices`.

Sizes come from the model folders when they exist, else from the config's `params_b` (the
paper's models are downloaded by the pipeline itself, after the plan is made).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# bytes per weight in a decode dtype ("auto" is bfloat16 or float16 on a GPU)
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
# per card, what the weights may not take: the CUDA context and the allocator's slack (about a
# GB), the KV cache of a prompt and its reply (1,200 tokens of a 32B Qwen: 0.3 GB) and a
# 60-node tree pass's activations and logits (well under a GB)
CARD_RESERVE_GB = 3.0


@dataclass(frozen=True)
class Placement:
    target_cards: int  # GPUs the target is spread over (evenly)
    draft_card: bool  # the draft has a GPU of its own after the target's; else it shares the last

    @property
    def gpus(self) -> int:
        return self.target_cards + int(self.draft_card)

    def devices(self, claimed: int) -> tuple[str, str]:
        """(target device, draft device) on `claimed` GPUs numbered from 0 (CUDA_VISIBLE_DEVICES
        set to the claimed ones): ("cuda:0,1", "cuda:1") for a target over two cards whose draft
        shares the second. No GPU: both on the CPU. One GPU short of the plan: the draft shares
        the target's last card; fewer than the target needs: a ValueError saying what to do."""
        if claimed <= 0:
            return "cpu", "cpu"
        if claimed < self.target_cards:
            raise ValueError(
                f"the target needs {self.target_cards} GPUs (its weights on cards of the size in "
                f"config key resources.gpu_memory_gb) and this job holds {claimed}: give the run "
                f"more GPUs (--resources gpu={self.target_cards}, resources.gpus_per_job >= "
                f"{self.target_cards}) or, if the cards are larger, set resources.gpu_memory_gb")
        cards = list(range(self.target_cards))
        target = "cuda:" + ",".join(map(str, cards))
        own = self.draft_card and claimed > self.target_cards
        return target, f"cuda:{self.target_cards if own else cards[-1]}"


def usable_gb(card_gb: float) -> float:
    return card_gb - CARD_RESERVE_GB


def place(target_gb: float, draft_gb: float, card_gb: float,
          own_draft_card: bool = False) -> Placement:
    """The fewest cards of `card_gb` that hold the target's weights spread evenly, and whether
    the draft needs a card of its own (asked for, or no room beside the target's share)."""
    room = usable_gb(card_gb)
    if room <= 0:
        raise ValueError(f"a {card_gb:g} GB card leaves no room for weights (resources.gpu_memory_gb)")
    cards = max(1, math.ceil(target_gb / room))
    shares = not own_draft_card and draft_gb <= room - target_gb / cards
    return Placement(cards, not shares)


def folder_weights_gb(folder: str | Path, dtype: str) -> float | None:
    """GB of the weights in `folder` once loaded in `dtype` (safetensors files, scaled from the
    dtype the config says they are stored in); None while the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    stored = 2
    config = folder / "config.json"
    if config.is_file():
        spec = json.loads(config.read_text())
        stored = DTYPE_BYTES.get(str(spec.get("dtype") or spec.get("torch_dtype")), 2)
    size = sum(f.stat().st_size for f in folder.rglob("*.safetensors"))
    return size / 2**30 * DTYPE_BYTES[dtype] / stored


def model_weights_gb(folder: str | Path, params_b: float | None, dtype: str) -> float:
    """A model's weights in GB: from its folder when it exists, else from its size in billions of
    parameters (config key models.NAME.params_b), else 0 (placed as if it fit anywhere)."""
    found = folder_weights_gb(folder, dtype)
    if found is not None:
        return found
    return (params_b or 0.0) * 1e9 * DTYPE_BYTES[dtype] / 2**30
