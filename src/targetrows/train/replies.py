"""`targetrows replies`: the target's own greedy replies to many chat prompts, the data both
trainings read (`distill` for a standalone draft, `train-eagle3` for an EAGLE-3 head).

One batched greedy pass per group of prompts (`reply_generation`: left padding, one KV cache;
finished replies leave the batch) keeps, at no extra cost:
- at every reply position, the target's final hidden state (fp16) and its top-k token ids: with
  the output head, any target logit is one dot product away, so neither training runs the
  target again. With `learn_prompts`, the same for the training prompts' own text: every
  position after the chat header all prompts share (the user's request is text the target
  predicts too: more labelled positions at no extra pass);
- at every position but the last, the residual stream entering the feature layers (Hugging Face
  ``hidden_states[i]``; by default 2, L//2 and L-3, what an EAGLE-3 head reads), fp16.

Batched generation makes many more tokens per second on a CPU than batch-1 decoding, and prompt
variety matters more than reply length: the prompts are template requests (`chat_prompts`) and
requests the target writes itself (`self_prompts`; only their text is kept, so they are written
in bfloat16 wherever that is fast, `write_dtype`), and optionally passages of Python's standard
library (`library_text`), labelled with their short replies. The training replies are generated
in the dtype the decoders run the target in (bfloat16 where that is fast, else float32;
`dtype`), the held-out replies, which measure agreement, by the target as loaded (float32). The
folder holds ``train.pt`` and ``heldout.pt`` (plain tensors, loaded weights-only) and
``replies.json`` (settings, sizes, time).

On GPUs (`make_replies(device=...)`, `targetrows replies --device`) the training replies and the
self prompts are written by a copy of the target loaded onto them in its dtype (spread over
several cards for a target larger than one); the float32 target, which writes the held-out
replies, stays on the CPU, so a target whose float32 weights fit no GPU still makes its
replies there.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from targetrows.core.atomic import new_folder

from .chat_prompts import HELDOUT_PROMPTS, training_prompts
from .library_text import library_passages
from .reply_generation import generate_batch
from .self_prompts import self_prompts


@dataclass
class RepliesConfig:
    seed: int = 0  # which training prompts, of both kinds
    # the prompts' mix and number are sized for the default run's time (docs/measurements.md)
    prompts: int = 256  # distinct template training prompts, one greedy reply each
    self_prompts: int = 1024  # and training prompts the target writes itself (`self_prompts`)
    heldout: int = len(HELDOUT_PROMPTS)
    max_new_tokens: int = 80  # cap on a training reply
    heldout_max_new_tokens: int = 112  # on a held-out one: fixed, so agreements compare
    gen_batch: int = 128
    top_k: int = 32
    features: bool = True  # keep the EAGLE-3 feature layers' inputs
    learn_prompts: bool = True  # label the training prompts' text after their shared header
    dtype: str = "auto"  # of the training replies (auto: the decoders'); held-out: float32
    write_dtype: str = "auto"  # of writing the self prompts (auto: bfloat16 where it is fast)
    data_minutes: float | None = None  # stop starting new batches after this (machine-dependent)
    # replies sampled at temperature 1 (seeded) besides the greedy ones, to this many training
    # prompts spread evenly over them (more than there are prompts: several each): other paths
    # through the same requests, with the target's own distributions as labels all the same
    # (docs/measurements.md, the head trials)
    sampled: int = 1280
    # passages of Python's standard library source (`library_text`) given as user messages and
    # labelled at every position of the prefill, each with a short greedy reply: text neither a
    # template nor the target wrote (off by default: docs/measurements.md, the head trials)
    library_passages: int = 0
    library_reply_tokens: int = 16
    thinking: bool | None = None  # the chat template's enable_thinking (None: its default)


def default_feature_layers(n_layers: int) -> tuple[int, int, int]:
    """The layers whose inputs an EAGLE-3 head reads: low, middle, high (EAGLE-3's choice)."""
    return (2, n_layers // 2, n_layers - 3)


@dataclass
class TeacherData:
    """The target's greedy replies: `sequences[i]` = prompt + reply, labelled from
    `prompt_lens[i]` on: the reply, or with `learn_prompts` the user's text and the reply (then
    `prompt_lens[i]` is the shared chat header's length). For the labelled positions of all
    sequences in order (position p predicts token p + 1, p = prompt_len - 1 .. len - 2): the
    target's final hidden state `hidden` (fp16) and its top-k ids `top`, best first. For
    positions 0 .. len - 2 of all sequences in order: `features`, the inputs of
    `feature_layers` concatenated (fp16), or None."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    hidden: torch.Tensor  # [reply rows, d]
    top: torch.Tensor  # [reply rows, k] int32
    features: torch.Tensor | None = None  # [sum(len - 1), len(feature_layers) * d]
    feature_layers: tuple[int, ...] = ()

    @property
    def reply_lens(self) -> list[int]:
        return [len(s) - p for s, p in zip(self.sequences, self.prompt_lens, strict=True)]

    def head(self, n: int) -> TeacherData:
        """The first `n` sequences."""
        rows = sum(self.reply_lens[:n])
        feats = None if self.features is None else self.features[
            : sum(len(s) - 1 for s in self.sequences[:n])]
        return TeacherData(self.sequences[:n], self.prompt_lens[:n], self.hidden[:rows],
                           self.top[:rows], feats, self.feature_layers)

    def __add__(self, other: TeacherData) -> TeacherData:
        """Both datasets' sequences, this one's first (same feature layers)."""
        if self.feature_layers != other.feature_layers:
            raise ValueError("replies with other feature layers cannot be joined")
        feats = None if self.features is None else torch.cat([self.features, other.features])
        return TeacherData(self.sequences + other.sequences, self.prompt_lens + other.prompt_lens,
                           torch.cat([self.hidden, other.hidden]), torch.cat([self.top, other.top]),
                           feats, self.feature_layers)

    def to_file(self, path: Path) -> None:
        lens = torch.tensor([len(s) for s in self.sequences])
        torch.save({"tokens": torch.tensor([t for s in self.sequences for t in s]),
                    "lens": lens, "prompt_lens": torch.tensor(self.prompt_lens),
                    "hidden": self.hidden, "top": self.top, "features": self.features,
                    "feature_layers": torch.tensor(self.feature_layers, dtype=torch.long)}, path)

    @classmethod
    def from_file(cls, path: Path) -> TeacherData:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        tokens = raw["tokens"].tolist()
        bounds = [0, *torch.cumsum(raw["lens"], 0).tolist()]
        sequences = [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return cls(sequences, raw["prompt_lens"].tolist(), raw["hidden"], raw["top"], raw["features"],
                   tuple(raw["feature_layers"].tolist()))


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens all `prompts` share (a chat template's header)."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for p in prompts[1:]:
        n = next((j for j in range(n) if p[j] != first[j]), n)
    return n


def teacher_data(model, prompts: list[list[int]], config: RepliesConfig, stop: set[int],
                 desc: str, deadline: float | None = None, learn_prompts: bool = False,
                 layers: Sequence[int] | None = None,
                 sampler: torch.Generator | None = None) -> TeacherData:
    """The target's greedy replies to `prompts`, in batches of similar length (sorted), in the
    prompts' order; prompts not reached before `deadline` (perf_counter) are left out. With
    `learn_prompts`, labelled from the end of the prompts' shared header on. `layers`: the
    feature layers kept (default: EAGLE-3's, when `config.features`); `sampler`: sample the
    replies at temperature 1 from it (`generate_batch`)."""
    if layers is None:
        layers = default_feature_layers(model.config.num_hidden_layers) if config.features else ()
    layers = tuple(sorted(layers))
    shared = shared_prefix(prompts) if learn_prompts and prompts else None
    label_from = [len(p) - 1 if shared is None else max(min(shared, len(p)) - 1, 0)
                  for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    done: dict[int, tuple] = {}
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=2.0)
    for start in range(0, len(order), config.gen_batch):
        if deadline is not None and time.perf_counter() > deadline:
            break
        chunk = order[start:start + config.gen_batch]
        out = generate_batch(model, [prompts[i] for i in chunk], config.max_new_tokens, stop,
                             config.top_k, layers, [label_from[i] for i in chunk], sampler)
        done.update(zip(chunk, out, strict=True))
        bar.update(len(chunk))
        bar.set_postfix(tokens=sum(len(v[0]) for v in done.values()))
    bar.close()
    kept = sorted(done)
    return TeacherData(
        sequences=[prompts[i] + done[i][0].tolist() for i in kept],
        prompt_lens=[label_from[i] + 1 for i in kept],
        hidden=torch.cat([done[i][1] for i in kept]),
        top=torch.cat([done[i][2] for i in kept]),
        features=torch.cat([done[i][3] for i in kept]) if layers else None,
        feature_layers=tuple(layers),
    )


def in_dtype(model, dtype: torch.dtype):
    """`model` itself in its own dtype, else a copy in `dtype`: never a round trip, so the
    caller's model keeps its weights."""
    return model if dtype == model.dtype else copy.deepcopy(model).to(dtype)


class DeviceCopies:
    """The target loaded from `folder` onto `device` (a GPU, or "cuda:0,1": spread evenly over
    those) once per dtype, for the replies written there: straight from its weights in that
    dtype (the values a cast of the float32 target holds; its rotary buffers stay float32, as
    in every decoder's load)."""

    def __init__(self, folder: str, device: str):
        self.folder, self.device, self.models = folder, device, {}

    def get(self, dtype: torch.dtype):
        if dtype not in self.models:
            from transformers import AutoModelForCausalLM

            from targetrows.hf.loading import device_map

            placement, max_memory = device_map(self.device)
            self.models[dtype] = AutoModelForCausalLM.from_pretrained(
                self.folder, dtype=dtype, device_map=placement, max_memory=max_memory).eval()
        return self.models[dtype]

    def clear(self) -> None:
        self.models.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def generate_replies(target, tokenizer, config: RepliesConfig,
                     copies: DeviceCopies | None = None) -> tuple[TeacherData, TeacherData, dict]:
    """(training data, held-out data, summary) for the loaded `target` (a transformers model).
    With `copies`, the training replies and self prompts are written on their device by the
    target loaded there; the held-out replies always by `target` as loaded."""
    from targetrows.hf.loading import resolve_dtype
    from targetrows.specbench.chat import encode_prompt, set_thinking, stop_ids

    set_thinking(tokenizer, config.thinking)
    if not 1 <= config.heldout <= len(HELDOUT_PROMPTS):
        raise ValueError(f"--heldout must be between 1 and {len(HELDOUT_PROMPTS)}")
    start = time.perf_counter()
    stop = stop_ids(tokenizer, target)
    where = str(target.device) if copies is None else copies.device

    def writing_in(dtype: str):  # the model that writes in `dtype` (resolved on its device)
        dtype = resolve_dtype(dtype, where)
        return in_dtype(target, dtype) if copies is None else copies.get(dtype)

    generator = writing_in(config.dtype)
    dtype = generator.dtype
    prompts = training_prompts(config.prompts, config.seed)
    written = []
    if config.self_prompts:  # only their text is kept: written in bfloat16 where that is fast
        writer = writing_in(config.write_dtype)
        written = self_prompts(writer, tokenizer, config.self_prompts, config.seed, stop,
                               exclude={*prompts, *HELDOUT_PROMPTS})
        del writer
    written_s = time.perf_counter() - start
    train_ids = [encode_prompt(tokenizer, p) for p in prompts + written]
    held_ids = [encode_prompt(tokenizer, p) for p in HELDOUT_PROMPTS[: config.heldout]]
    cap = None if config.data_minutes is None else start + 60 * config.data_minutes
    train = teacher_data(generator, train_ids, config, stop, "target replies", cap,
                         config.learn_prompts)
    train, library = _more_replies(generator, tokenizer, train, train_ids, config, stop, cap)
    del generator
    if copies is not None:
        copies.clear()
    held_config = replace(config, max_new_tokens=config.heldout_max_new_tokens)
    held = teacher_data(target, held_ids, held_config, stop, "held-out replies")
    summary = {
        "config": asdict(config), "train_dtype": str(dtype).removeprefix("torch."),
        "feature_layers": list(train.feature_layers),
        "train_prompts": len(train.sequences), "train_positions": len(train.hidden),
        "heldout_prompts": len(held.sequences), "heldout_positions": len(held.hidden),
        "library_prompts": len(library), "self_prompts_seconds": written_s,
        "self_prompt_examples": written[:8],
        "stop_ids": sorted(stop), "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    if copies is not None:
        summary["device"] = copies.device
    print(f"replies: {summary['train_prompts']} replies, {summary['train_positions']} positions "
          f"in {summary['seconds']:.0f} s", file=sys.stderr)
    return train, held, summary


def _more_replies(generator, tokenizer, train: TeacherData, train_ids: list[list[int]],
                  config: RepliesConfig, stop, cap) -> tuple[TeacherData, list[list[int]]]:
    """`train` with the sampled replies and library passages `config` asks for; and the
    passages' prompts."""
    from targetrows.specbench.chat import encode_prompt

    if config.sampled:  # more replies, sampled (seeded), to prompts spread over the list
        again = [train_ids[i * len(train_ids) // config.sampled] for i in range(config.sampled)]
        sampler = torch.Generator(device=generator.get_output_embeddings().weight.device)
        sampler.manual_seed(config.seed + 1)
        train = train + teacher_data(generator, again, config, stop, "sampled replies", cap,
                                     config.learn_prompts, sampler=sampler)
    library = []
    if config.library_passages:  # their text is the point: labelled whatever learn_prompts says
        passages = library_passages(config.library_passages, config.seed)
        library = [encode_prompt(tokenizer, p) for p in passages]
        short = replace(config, max_new_tokens=config.library_reply_tokens)
        train = train + teacher_data(generator, library, short, stop, "library passages", cap,
                                     learn_prompts=True)
    return train, library


def load_target(target_dir: str, device: str = "cpu"):
    """(tokenizer, fp32 transformers model in eval mode on `device`) of a target folder; on the
    CPU its linear layers multiply by prepacked weights (`targetrows.hf.packed`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from targetrows.hf.packed import pack_linears

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target = target.to(device).eval()
    pack_linears(target)
    return tokenizer, target


def make_replies(target_dir: str, out: str | Path, config: RepliesConfig,
                 force: bool = False, device: str = "cpu") -> dict:
    """Write the replies folder `out` for the target at `target_dir`; return its summary.
    `device`: where the training replies and self prompts are written ("cpu", or GPUs: "cuda",
    "cuda:1", "cuda:0,1"); the held-out replies are the float32 target's, on the CPU."""
    out = Path(out)
    if out.exists() and not force:
        raise ValueError(f"{out} already exists; pass --force to replace it")
    tokenizer, target = load_target(target_dir)
    copies = None if device == "cpu" else DeviceCopies(target_dir, device)
    train, held, summary = generate_replies(target, tokenizer, config, copies)
    summary = {"target": str(target_dir), **summary}
    with new_folder(out, force) as tmp:
        train.to_file(tmp / "train.pt")
        held.to_file(tmp / "heldout.pt")
        (tmp / "replies.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def read_replies(folder: str | Path) -> tuple[TeacherData, TeacherData, dict]:
    """(training data, held-out data, summary) of a replies folder."""
    folder = Path(folder)
    if not (folder / "replies.json").is_file():
        raise FileNotFoundError(f"{folder} is not a replies folder (no replies.json); make one "
                                "with `targetrows replies --target T --out DIR`")
    summary = json.loads((folder / "replies.json").read_text())
    return (TeacherData.from_file(folder / "train.pt"),
            TeacherData.from_file(folder / "heldout.pt"), summary)


def replies_for(target, tokenizer, folder: str | Path | None, config: RepliesConfig):
    """The replies a training reads: from `folder` (made by `targetrows replies` for this
    target), or generated now with `config` when `folder` is None."""
    if folder is None:
        return generate_replies(target, tokenizer, config)
    train, held, summary = read_replies(folder)
    if max(max(s) for s in train.sequences) >= target.config.vocab_size:
        raise ValueError(f"replies {folder} hold token ids beyond the target's vocabulary: they "
                         "were made for another target")
    if len(train.hidden) and train.hidden.shape[1] != target.config.hidden_size:
        raise ValueError(f"replies {folder} hold hidden states of width {train.hidden.shape[1]}, "
                         f"the target's hidden_size is {target.config.hidden_size}: they were "
                         "made for another target")
    return train, held, summary
