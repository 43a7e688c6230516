"""Loading a target/draft pair of Hugging Face models and their tokenizer, and encoding prompts.

Models come from a local folder or a hub id, as safetensors or GGUF; pickle weights (`.bin`,
`.pt`) can run code when loaded, so they are refused unless the user allows them. The target
and draft must share one tokenizer (same token -> id map): that is checked before any weights
load, so a mismatch costs seconds, not a download.
"""

from __future__ import annotations

import glob
import os
import re

import torch

from .choices import DTYPE_NAMES, TRUST_CHOICES
from .model import HFModel
from .packed import pack_linears

DTYPES = {name: getattr(torch, attr) for name, attr in DTYPE_NAMES.items()}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_PADDING = re.compile(r"^\[PAD\d+\]$")


def resolve_device(device: str | None) -> str:
    """None -> the first GPU if there is one, else the CPU; anything else as given, checked
    against this torch: a GPU it cannot reach is a ValueError naming what to do."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    kind = device.partition(":")[0]
    if kind in ("cuda", "auto") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible to it"
        raise ValueError(f"device {device!r}: this torch ({torch.__version__}) has {build}; "
                         "use --target-device cpu (and --draft-device cpu), or install torch "
                         "for your CUDA version")
    if kind == "cuda" and (ids := device.partition(":")[2]):
        count = torch.cuda.device_count()
        for card in ids.split(","):
            if not card.isdigit() or int(card) >= count:
                raise ValueError(f"device {device!r}: GPU {card} is not one of the {count} "
                                 f"visible (cuda:0 to cuda:{count - 1})")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """ "auto" -> bfloat16 wherever its matrix products are fast (`bfloat16_is_fast`: a GPU of
    compute capability 8.0 or later, a CPU with AMX or AVX512-BF16 units), else float16 on an
    older GPU (a V100 or T4 emulates bfloat16) and float32 on any other CPU. Every decoder is
    lossless with respect to the model as it runs, in whichever dtype; float32 stays
    selectable."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if bfloat16_is_fast(device):
            return torch.bfloat16
        return torch.float16 if _cuda_index(device) is not None else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto or one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _cuda_index(device: str) -> int | None:
    """The (first) GPU a device string names ("cuda" and "auto": the current one, when there is
    a GPU), or None for the CPU."""
    if device == "auto":
        return torch.cuda.current_device() if torch.cuda.is_available() else None
    if not device.startswith("cuda"):
        return None
    ids = device.partition(":")[2]
    if ids:
        return int(ids.split(",")[0])
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def bfloat16_is_fast(device: str) -> bool:
    """Whether bfloat16 matrix products outrun float32 ones on `device`: on a GPU with bfloat16
    tensor cores (compute capability 8.0, Ampere, or later), and on a CPU with AMX or
    AVX512-BF16 units that torch's kernels are allowed to use (elsewhere they are emulated,
    slower than float16 or float32)."""
    index = _cuda_index(device)
    if index is not None:
        if not torch.cuda.is_available():  # nothing to ask (a plan made away from the GPU)
            return True
        return torch.cuda.get_device_capability(index)[0] >= 8
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # private, so guarded
    return any(getattr(cpu, name, lambda: False)() for name in checks) and kernels_take_bf16()


def kernels_take_bf16() -> bool:
    """Whether torch's CPU kernels may use the CPU's bfloat16 units: oneDNN's and ATen's
    instruction sets can be held below the CPU's (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), as
    when measuring what an AVX2 machine does."""
    onednn = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)()
    return onednn and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def device_map(device: str) -> tuple[str, dict | None]:
    """`from_pretrained`'s device_map and max_memory for a device string: "auto" spreads the
    model over every visible GPU, "cuda:0,1" evenly over GPUs 0 and 1 only (what the
    pipeline's placement asks for a target larger than one card), anything else puts all of
    it on that one device."""
    if device == "auto":
        return "auto", None
    kind, _, ids = device.partition(":")
    if kind != "cuda" or "," not in ids:
        return device, None
    try:
        cards = [int(i) for i in ids.split(",")]
    except ValueError:
        raise ValueError(f"device {device!r}: name GPUs by number, as cuda:0,1") from None
    if len(set(cards)) != len(cards):
        raise ValueError(f"device {device!r} names a GPU twice")
    return "balanced", {i: torch.cuda.get_device_properties(i).total_memory for i in cards}


def draft_dtype_for(dtype: str | torch.dtype, draft_dtype: str | torch.dtype | None,
                    device: str | None) -> str | torch.dtype:
    """The dtype a draft loads in: `draft_dtype` if given, else the target's `dtype` ("auto":
    bfloat16 wherever that is fast). A draft only proposes tokens, so its precision changes
    speed and acceptance, never the committed tokens."""
    if draft_dtype is not None:
        return draft_dtype
    if dtype == "auto":
        return resolve_dtype(dtype, resolve_device(device))
    return dtype


def _locate(path: str, allow_pickle: bool, gguf_file: str | None) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name or None) for `path`, or ValueError naming it."""
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
        raise ValueError(f"model path {path!r} is a file; give its folder, or a .gguf file")
    if not os.path.isdir(path):
        looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or "\\" in path
        if looks_local or not _HUB_ID.match(path):
            raise ValueError(
                f"model {path!r} is neither a local folder nor a Hugging Face hub id (owner/name)"
            )
        return path, gguf_file  # a hub id: from_pretrained checks the files
    if gguf_file is not None:
        if not os.path.isfile(os.path.join(path, gguf_file)):
            raise ValueError(f"GGUF file {gguf_file!r} is not in model folder {path!r}")
        return path, gguf_file
    if glob.glob(os.path.join(path, "*.safetensors")):
        return path, None
    ggufs = sorted(os.path.basename(f) for f in glob.glob(os.path.join(path, "*.gguf")))
    if len(ggufs) == 1:
        return path, ggufs[0]
    if len(ggufs) > 1:
        raise ValueError(f"model folder {path!r} holds several GGUF files {ggufs}; name one")
    pickles = [f for p in _PICKLE_PATTERNS for f in glob.glob(os.path.join(path, p))]
    if pickles and not allow_pickle:
        raise ValueError(
            f"model folder {path!r} only has pickle weights ({os.path.basename(pickles[0])}), "
            "which can run code when loaded; convert them to safetensors, or pass "
            "--allow-pickle (allow_pickle=True) if you trust the source"
        )
    if not pickles:
        raise ValueError(
            f"model folder {path!r} has no weights (*.safetensors, *.gguf or pickle *.bin)"
        )
    return path, None


def load_tokenizer(
    path: str,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    allow_pickle: bool = False,
):
    """The tokenizer of model `path` (folder, hub id or .gguf file)."""
    from transformers import AutoTokenizer

    where, gguf = _locate(path, allow_pickle, gguf_file)
    try:
        return AutoTokenizer.from_pretrained(
            where, trust_remote_code=trust_remote_code, gguf_file=gguf
        )
    except OSError as err:
        raise ValueError(f"cannot load the tokenizer of model {path!r}: {err}") from err
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise _remote_code_refused(path) from err
        raise


def load_model(
    path: str,
    device: str | None = "cpu",
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    gguf_file: str | None = None,
    tokenizer=None,
    packed: bool = True,
):
    """(HFModel, tokenizer) for the causal LM at `path` (local folder, hub id or .gguf file).

    device: "cpu", "cuda", "cuda:1", ..., "cuda:0,1" (spread evenly over those GPUs), "auto"
    (spread over every visible GPU), or None (the first GPU if any, else the CPU). dtype: "auto"
    (`resolve_dtype`: bfloat16 wherever it is fast, else float16 on a GPU, float32 on a CPU)
    or a name in `DTYPES`. Pass `tokenizer` to skip loading
    it again. `packed`: a CPU model's linear layers multiply by prepacked weights
    (`targetrows.hf.packed`).
    """
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    where, gguf = _locate(path, allow_pickle, gguf_file)
    if tokenizer is None:
        tokenizer = load_tokenizer(path, trust_remote_code, gguf_file, allow_pickle)
    placement, max_memory = device_map(device)
    kwargs = dict(
        dtype=torch_dtype,
        device_map=placement,
        max_memory=max_memory,
        trust_remote_code=trust_remote_code,
        gguf_file=gguf,
        use_safetensors=None if (allow_pickle or gguf) else True,
    )
    load = AutoModelForCausalLM.from_pretrained
    try:
        try:
            model = load(where, attn_implementation="sdpa", **kwargs)
        except ValueError as err:  # custom code without SDPA support: eager takes 4D masks too
            if "sdpa" not in str(err).lower():
                raise
            model = load(where, attn_implementation="eager", **kwargs)
    except OSError as err:
        hint = "" if allow_pickle else " (pickle .bin weights need --allow-pickle)"
        raise ValueError(f"cannot load model {path!r}: {err}{hint}") from err
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise _remote_code_refused(path) from err
        raise
    if packed:
        pack_linears(model)
    width = int(model.get_output_embeddings().weight.shape[0])
    return HFModel(model, vocab_size=min(len(tokenizer), width), name=path), tokenizer


def _remote_code_refused(path: str) -> ValueError:
    """transformers' refusal to run a checkpoint's own code, said in terms of our option."""
    return ValueError(
        f"model {path!r} ships its own Python code, which would run on loading; it is refused "
        "unless you pass --trust-remote-code (trust_remote_code=True; in the pipeline, "
        "trust_remote_code: true on that model in the config): read the code first"
    )


def tokenizer_difference(a, b) -> str | None:
    """None when tokenizers `a` and `b` map the same tokens to the same ids, else the first
    difference in words. Ids past the smaller vocabulary may only hold llama.cpp's padding
    placeholders (``[PAD151665]``...): a GGUF lists them, the Hugging Face tokenizer does not."""
    va, vb = a.get_vocab(), b.get_vocab()
    if va == vb:
        return None
    size = min(len(va), len(vb))
    for vocab, other in ((va, vb), (vb, va)):
        extra = [t for t, i in vocab.items() if i >= size and not _PADDING.match(t)]
        if extra:
            token = min(extra, key=vocab.get)
            return (
                f"{len(va)} vs {len(vb)} tokens; token {token!r} (id {vocab[token]}) is in one only"
            )
        mismatch = [t for t, i in vocab.items() if i < size and other.get(t) != i]
        if mismatch:
            token = min(mismatch, key=vocab.get)
            return f"token {token!r} has id {va.get(token)} vs {vb.get(token)}"
    return None


def trusts(trust_remote_code: bool | str, role: str) -> bool:
    """Whether `role` ("target" or "draft") may run its checkpoint's code: True/"all" lets both,
    "target" or "draft" that model only."""
    if isinstance(trust_remote_code, str):
        if trust_remote_code not in TRUST_CHOICES:
            raise ValueError(f"trust_remote_code={trust_remote_code!r}: use True, False or one "
                             f"of {', '.join(TRUST_CHOICES)}")
        return trust_remote_code in ("all", role)
    return bool(trust_remote_code)


def load_pair(
    target: str,
    draft: str | None,
    target_device: str | None = None,
    draft_device: str | None = None,
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool | str = False,
    allow_pickle: bool = False,
    packed: bool = True,
    draft_dtype: str | torch.dtype | None = None,
) -> tuple[HFModel, HFModel | None, object]:
    """(target, draft, tokenizer). The draft goes on `draft_device` (default: the target's
    device; for a target spread over GPUs, the one its rows come out on); ``draft=None`` gives
    no draft (autoregressive decoding). Rows of both models are cut to one vocabulary size.
    `trust_remote_code`: see `trusts`. A draft that is an EAGLE-3 head (folder or hub id) is
    checked against the target before its weights load and bound to it
    (`targetrows.hf.eagle3`). `packed`: as in `load_model`, for both models.
    `draft_dtype`: the draft's own dtype (default: `draft_dtype_for`)."""
    draft_dtype = draft_dtype_for(dtype, draft_dtype, draft_device or target_device)
    if draft is not None:
        from targetrows.heads.checkpoint import head_config

        if head_config(draft) is not None:
            return _load_target_and_head(target, draft, target_device, draft_device, dtype,
                                         trusts(trust_remote_code, "target"), allow_pickle,
                                         packed, draft_dtype)
    target_device = resolve_device(target_device)
    trust_target = trusts(trust_remote_code, "target")
    trust_draft = trusts(trust_remote_code, "draft")
    tokenizer = load_tokenizer(target, trust_target, allow_pickle=allow_pickle)
    vocab = len(tokenizer)
    if draft is not None:
        draft_tokenizer = load_tokenizer(draft, trust_draft, allow_pickle=allow_pickle)
        vocab = min(vocab, len(draft_tokenizer))
        difference = tokenizer_difference(tokenizer, draft_tokenizer)
        if difference:
            raise ValueError(
                f"target {target!r} and draft {draft!r} have different tokenizers ({difference}); "
                "speculative decoding needs a draft that shares the target's tokenizer"
            )
    options = dict(dtype=dtype, allow_pickle=allow_pickle, tokenizer=tokenizer, packed=packed)
    target_model, _ = load_model(target, target_device, trust_remote_code=trust_target,
                                 **options)
    if draft is None:
        return target_model, None, tokenizer
    if draft_device is None:  # the target's device; of a target spread over GPUs, its last one
        spread = device_map(target_device)[0] != target_device
        draft_device = str(target_model.device) if spread else target_device
    options["dtype"] = draft_dtype
    draft_model, _ = load_model(draft, draft_device, trust_remote_code=trust_draft, **options)
    # the shared vocabulary: padding (logit widths, GGUF placeholders) is cut from both
    vocab = min(vocab, target_model.vocab_size, draft_model.vocab_size)
    target_model.vocab_size = draft_model.vocab_size = vocab
    return target_model, draft_model, tokenizer


def _load_target_and_head(target, head, target_device, head_device, dtype, trust_target,
                          allow_pickle, packed, head_dtype):
    """`load_pair` for an EAGLE-3 head: it has no tokenizer of its own (it drafts in the
    target's ids), so the checks are the head's config against the target's."""
    target_device = resolve_device(target_device)
    tokenizer = load_tokenizer(target, trust_target, allow_pickle=allow_pickle)
    target_model, _ = load_model(target, target_device, dtype, trust_target, allow_pickle,
                                 tokenizer=tokenizer, packed=packed)
    head_dtype = resolve_dtype(head_dtype, head_device or target_device)
    draft = load_eagle3(head, target_model, device=head_device, dtype=head_dtype,
                        target_name=target)
    if packed:
        pack_linears(draft.head)
    return target_model, draft, tokenizer


def load_eagle3(path: str, target: HFModel, device: str | None = None,
                dtype: torch.dtype | None = None, target_name: str | None = None):
    """An `Eagle3Draft` for the head at `path` (folder or hub id) bound to `target`, on `device`
    (default: the target's) in `dtype` (default: the target's), read and checked against the
    target by `targetrows.heads.checkpoint.load_head`."""
    from targetrows.heads.checkpoint import load_head

    from .eagle3 import Eagle3Draft

    head, layers = load_head(path, target.model, device or target.device, dtype or target.dtype,
                             target_name or target.name)
    return Eagle3Draft(head, target, layers, name=path)
