"""What several commands share: the model options, the budget option, and the checks of the
values every command validates the same way (each message names its option)."""

from __future__ import annotations

import argparse
import sys

from targetrows.core.checks import check_count, check_temperature
from targetrows.core.pool import PoolShape
from targetrows.decoding.budget import Auto, Fixed, parse_budget
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.registry import decoder_names, get_decoder, pass_widths

POOL, DECODE = PoolShape(), DecodeConfig()  # the library's defaults are the options' defaults


class UsageError(Exception):
    """Bad user input: the message names it; the CLI prints it and exits with status 2."""


class BudgetError(ValueError, argparse.ArgumentTypeError):
    """A bad budget: a ValueError for callers, and argparse prints its message as it is."""


def budget_type(option: str):
    """argparse type of a budget option: a positive integer or auto (`parse_budget`, which
    also reads the config's and the bench's budgets); a bad value's message names `option`."""
    def parse(value: str) -> Fixed | Auto:
        try:
            budget = parse_budget(value, option)
        except ValueError as err:
            raise BudgetError(str(err)) from None
        if not isinstance(budget, Fixed | Auto):  # a matched cap is the pipeline's to resolve
            raise BudgetError(f"{option} takes a positive integer or auto, got {value!r}")
        return budget
    return parse


def add_pool_arguments(parser: argparse.ArgumentParser, auto: bool = True) -> None:
    """--top-k --depth: the candidate pool (`PoolShape`)."""
    parser.add_argument("--top-k", type=int, default=POOL.top_k,
                        help="pool: children per frontier node")
    parser.add_argument("--depth", type=int, default=POOL.depth,
                        help="pool: levels" + ("; under --budget(s) auto, the deepest pool "
                                               "tried (auto picks the depth too)" if auto else ""))


def add_decoding_arguments(parser: argparse.ArgumentParser, max_new_tokens: int | None = None,
                           decoders: bool = True) -> None:
    """--max-new-tokens --seed --top-k --depth (the candidate pool), the draft-free decoders'
    --recycle-k --keep-across-prompts and, with `decoders`, --decoders (default: every
    registered decoder)."""
    parser.add_argument("--max-new-tokens", type=int,
                        default=max_new_tokens or DECODE.max_new_tokens)
    parser.add_argument("--seed", type=int, default=DECODE.seed)
    add_pool_arguments(parser)
    parser.add_argument("--recycle-k", type=int, default=DECODE.recycle_k,
                        help="racer, recycle: the target's top-k next tokens kept per token")
    parser.add_argument("--keep-across-prompts", action=argparse.BooleanOptionalAction,
                        default=DECODE.keep_across_prompts,
                        help="racer, recycle: carry what the target's rows taught them from one "
                        "prompt to the next, as the published codes do (off: each prompt's trees "
                        "depend on that prompt alone)")
    if decoders:
        parser.add_argument("--decoders", nargs="+", default=None, choices=decoder_names(),
                            help="default: every registered decoder (the learned ones when "
                            "--reranker gives their models)")


def add_batch_argument(parser: argparse.ArgumentParser) -> None:
    """--batch-size N: sequences decoded at once (`targetrows.decoding.batch`)."""
    parser.add_argument("--batch-size", type=int, default=1, metavar="N",
                        help="decode N prompts at once, their passes batched; each prompt's "
                             "tokens are its batch-1 tokens (in bfloat16 up to near-ties: "
                             "docs/decoders.md, 'Batches')")


def batch_size_from(args: argparse.Namespace) -> int:
    """--batch-size, checked; 1 for a command without it."""

    return check_count(getattr(args, "batch_size", 1), "--batch-size")


def add_reranker_argument(parser: argparse.ArgumentParser) -> None:
    """--reranker FILE ...: trained models of the learned rules (one file per rule)."""
    parser.add_argument("--reranker", nargs="+", default=[], metavar="FILE",
                        help="models from `targetrows train-reranker`, one per learned rule "
                        "(learned_rerank, learned_stale_rerank, sequoia): what lrerank, "
                        "lrerank_stale and sequoia score with")


def rerankers_from(args: argparse.Namespace, temperatures=()) -> dict:
    """{rule: model} from --reranker: rerankers, or Sequoia's acceptance vector (a rule named
    twice is an error). A model trained on row logs at another temperature than one of
    `temperatures` still runs (every decoder is lossless), with a warning: what it learned
    about acceptance may not carry over."""
    from targetrows.core.rules.fitted import load_fitted

    out = {}
    for path in getattr(args, "reranker", None) or []:
        model = load_fitted(path)
        if model.rule in out:
            raise ValueError(f"--reranker: two files for rule {model.rule!r}")
        trained = model.meta.get("temperature")
        other = [t for t in temperatures if trained is not None and float(t) != float(trained)]
        if other:
            print(f"warning: --reranker {path} was trained on row logs at temperature "
                  f"{float(trained):g}, and this run decodes at {float(other[0]):g}; train one "
                  "at that temperature with targetrows train-reranker", file=sys.stderr)
        out[model.rule] = model
    return out


def decoders_from(args: argparse.Namespace, rerankers: dict) -> list[str]:
    """--decoders, or every registered decoder whose reranker (if it needs one) was given;
    a named learned decoder without its reranker is an error naming the option."""
    names = args.decoders or [d for d in decoder_names() if not get_decoder(d).learned
                              or get_decoder(d).rule in rerankers]
    for name in names:
        entry = get_decoder(name)
        if entry.learned and entry.rule not in rerankers:
            raise ValueError(f"decoder {name} scores with a trained reranker for rule "
                             f"{entry.rule!r}: give it with --reranker FILE")
    return names


def pool_from(args: argparse.Namespace) -> PoolShape:
    """The pool the options describe (checked, each message naming its option)."""
    try:
        return PoolShape(top_k=args.top_k, depth=args.depth)
    except ValueError as err:
        raise ValueError(f"--{str(err).replace('_', '-')}") from None


def decode_config(args: argparse.Namespace, decoder: str = "ar", budget: int | None = None,
                  temperature: float | None = None, **fields) -> DecodeConfig:
    """A `DecodeConfig` from the options add_decoding_arguments added (a tree decoder without
    a `budget` takes the default one)."""
    entry = get_decoder(decoder)
    if budget is None and entry.drafts:
        budget = DECODE.budget
    return DecodeConfig(decoder=entry, budget=budget,
                        temperature=args.temperature if temperature is None else temperature,
                        max_new_tokens=check_count(args.max_new_tokens, "--max-new-tokens"),
                        pool=pool_from(args), seed=args.seed,
                        recycle_k=args.recycle_k, keep_across_prompts=args.keep_across_prompts,
                        batch_size=batch_size_from(args), **fields)


def check_outputs(prompts, outs, what: str) -> None:
    """One output (`what`: "answers file", "row log") per prompts file, none named twice."""
    import os

    if len(outs) != len(prompts):
        raise UsageError(f"--out names {len(outs)} {what}s for {len(prompts)} --prompts files; "
                         f"give one {what} per prompts file")
    if len(set(map(os.path.abspath, outs))) != len(outs):
        raise UsageError(f"--out names one {what} twice; give each prompts file its own")
    for out in outs:
        check_output_file(out, "--out")


def check_output_file(path: str, option: str) -> None:
    """Before any work: `path` can be written as a file (an existing folder cannot; a missing
    folder above it is made), or UsageError naming `option`."""
    import os

    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a folder; name a file to write")
    _writable_folder(os.path.dirname(os.path.abspath(path)), option)


def check_output_folder(path: str, option: str) -> None:
    """Before any work: `path` can be written into as a folder (made if missing; an existing
    file cannot), or UsageError naming `option`."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a file; name a folder to write into")
    _writable_folder(os.path.abspath(path), option)


def _writable_folder(folder: str, option: str) -> None:
    import os

    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option}: cannot make the folder {folder} ({err.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: the folder {folder} is not writable")


def check_temperatures(temperatures, option: str = "--temperature") -> None:
    for t in temperatures:
        check_temperature(t, option)


def check_draft(decoders, draft: str | None) -> None:
    """Every decoder that drafts with a model needs --draft (names are checked against the
    registry)."""
    drafting = [d for d in decoders if get_decoder(d).needs_draft]
    if drafting and not draft:
        raise ValueError(f"--draft is required for {', '.join(drafting)} (ar and the draft-free "
                         "decoders run without one)")


def drop_unneeded_draft(args: argparse.Namespace, decoders) -> None:
    """A --draft given is not loaded when none of `decoders` drafts with one (ar, the
    draft-free decoders), and --draft-lookup, which would wrap it, goes with it; --draft-lookup
    without --draft is still the error `load_from_args` names."""
    if args.draft and not any(get_decoder(d).needs_draft for d in decoders):
        args.draft, args.draft_lookup = None, False


def add_model_arguments(parser: argparse.ArgumentParser, draft: bool = True) -> None:
    """--target --draft --draft-lookup --target-device --draft-device --dtype --draft-dtype
    --trust-remote-code --allow-pickle --graphs --max-context --plain-linears (no draft options when
    ``draft=False``). Imports no torch: `--help` and a mistyped option answer at once."""
    from targetrows.hf.choices import DTYPE_NAMES, TRUST_CHOICES

    parser.add_argument(
        "--target",
        required=True,
        help="target model: local folder, .gguf file or Hugging Face hub id",
    )
    if draft:
        _add_draft_arguments(parser)
    parser.add_argument(
        "--target-device",
        default=None,
        help="cpu, cuda, cuda:N, cuda:0,1 (spread evenly over those GPUs) or auto (over every "
        "visible GPU); default: cuda if available, else cpu",
    )
    if draft:
        parser.add_argument(
            "--draft-device", default=None, help="device of the draft; default: the target's"
        )
    parser.add_argument(
        "--thinking", choices=["on", "off"], default=None,
        help="render the chat template with thinking on or off (its enable_thinking variable, "
        "as in Qwen3's); default: the template's own",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPE_NAMES],
        help="weights dtype; auto: bfloat16 wherever it is fast (a GPU of compute capability 8 "
        "or later, or a CPU with AMX or AVX512-BF16), float16 on an older GPU, else float32",
    )
    if draft:
        parser.add_argument(
            "--draft-dtype",
            default=None,
            choices=["auto", *DTYPE_NAMES],
            help="the draft's weights dtype (a draft only proposes tokens, so its precision "
            "changes speed, never the output); default: --dtype's",
        )
    parser.add_argument(
        "--trust-remote-code",
        nargs="?",
        const="all",
        default=False,
        choices=TRUST_CHOICES if draft else ("all", "target"),
        help="run model code shipped with the checkpoint (only if you trust it): of both models "
        "(no value, or 'all'), or of the 'target' or the 'draft' only",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow pickle .bin weights, which can run code when loaded",
    )
    _add_pass_arguments(parser)


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft",
        default=None,
        help="draft model with the target's tokenizer (folder, .gguf, hub id)",
    )
    parser.add_argument(
        "--draft-lookup",
        action="store_true",
        help="mix prompt lookup's guess (the token that followed the last two tokens, or the "
        "last one, earlier in the context) into the draft's proposals; lossless like any "
        "draft (docs/decoders.md)",
    )


def _add_pass_arguments(parser: argparse.ArgumentParser) -> None:
    """How the models' passes run: --graphs, --max-context, --plain-linears."""
    from targetrows.hf.choices import GRAPH_MODES

    parser.add_argument(
        "--graphs", choices=GRAPH_MODES, default="off",
        help="pad every pass to a few fixed shapes over the whole cache and replay each as a "
        "CUDA graph: auto where they can run (one CUDA card, a Llama, Qwen2 or Qwen3 model; "
        "unpadded elsewhere), on (an error where they cannot), off (passes over the live "
        "entries; the default until a GPU run has checked graphs, docs/cluster.md)",
    )
    parser.add_argument(
        "--max-context", type=int, default=None, metavar="N",
        help="entries each sequence's cache may hold (prompt, answer and one round's tree), "
        "with or without --graphs; a longer context is an error naming this option; default: "
        "the model's context window on a CPU, 4096 (at most the window) on a GPU",
    )
    parser.add_argument(
        "--plain-linears",
        action="store_true",
        help="on the CPU, keep torch's own linear layers instead of weights prepacked for "
        "oneDNN (slower; rows differ only by float rounding)",
    )


def draft_label(args: argparse.Namespace) -> str | None:
    """The draft as outputs name it: its path, marked when prompt lookup is mixed in."""
    if args.draft and getattr(args, "draft_lookup", False):
        return f"{args.draft} + prompt lookup"
    return args.draft


def thinking_arg(args: argparse.Namespace) -> bool | None:
    """--thinking on/off as True/False; None when not given (the template's default)."""
    value = getattr(args, "thinking", None)
    return None if value is None else value == "on"


def pass_widths_from(args: argparse.Namespace) -> tuple[int, ...]:
    """The pass widths of the decoders and fixed budgets the options name (every decoder
    where none is named; an auto budget's trees are sized later and pad to a power of two)."""
    names = ([args.decoder] if getattr(args, "decoder", None)
             else getattr(args, "decoders", None) or decoder_names())
    given = getattr(args, "budgets", None) or [getattr(args, "budget", None)]
    budgets = [b.nodes if isinstance(b, Fixed) else b for b in given
               if isinstance(b, Fixed | int)] or [DECODE.budget]
    pool = pool_from(args) if hasattr(args, "top_k") else POOL
    return pass_widths(names, pool, budgets)


def load_from_args(args: argparse.Namespace):
    """(target, draft, tokenizer): `load_pair` with the options `add_model_arguments` added;
    under --draft-lookup the draft is a `LookupDraft` around the loaded one."""
    from targetrows.hf.loading import load_pair
    from targetrows.specbench.chat import set_thinking

    target, draft, tokenizer = load_pair(
        args.target,
        getattr(args, "draft", None),
        args.target_device,
        getattr(args, "draft_device", None),
        args.dtype,
        args.trust_remote_code,
        args.allow_pickle,
        packed=not args.plain_linears,
        draft_dtype=getattr(args, "draft_dtype", None),
    )
    set_thinking(tokenizer, thinking_arg(args))
    graphs, capacity = getattr(args, "graphs", "off"), getattr(args, "max_context", None)
    if graphs != "off" or capacity is not None:
        from targetrows.hf.graphs import apply_graphs

        if capacity is not None:
            check_count(capacity, "--max-context")
        apply_graphs([target, draft], graphs, capacity, pass_widths_from(args))
    for model in (target, draft):  # what a job's log keeps: how its passes ran
        if hasattr(model, "passes_described"):
            print(f"{model.name}: {model.passes_described()}", file=sys.stderr)
    if getattr(args, "draft_lookup", False):
        if draft is None:
            raise ValueError("--draft-lookup mixes prompt lookup into a draft: give --draft too")
        from targetrows.core.lookup import LookupDraft

        draft = LookupDraft(draft)
    return target, draft, tokenizer
