"""`targetrows bench --target T --draft D --prompts Q.jsonl`: our decoders against Hugging Face
generation (plain, assisted by --assistant or a standalone draft, prompt lookup) and any peer
engines (`--peer`, `targetrows.bench.peer`) on one pair and machine, interleaved prompt by prompt
(`targetrows.bench.run`); a tidy CSV and a Markdown report under --out-dir. With --batch-size N
above 1: every decoder decoding N prompts at once against Hugging Face's batched generate
(`targetrows.bench.batched`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import tempfile

from targetrows.bench.peer import Peer, PeerSpec
from targetrows.bench.plan import BenchSettings
from targetrows.core.checks import check_count

from .common import (
    add_batch_argument,
    add_decoding_arguments,
    add_model_arguments,
    add_reranker_argument,
    budget_type,
    check_draft,
    check_output_folder,
    decode_config,
    decoders_from,
    rerankers_from,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", nargs="+",
                     help="prompts JSONL files (Spec-Bench question format; first turns)")
    src.add_argument("--prompt", action="append", help="a user message (repeat for several)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="the first N of each --prompts file")
    parser.add_argument("--temperature", type=float, nargs="+",
                        default=[BenchSettings().temperatures[0]],
                        help="one condition each (0: greedy; > 0: pure sampling)")
    parser.add_argument("--budget", type=budget_type("--budget"), default=BenchSettings().budget,
                        help="non-root nodes per tree, or auto (budget and pool depth, at most "
                             "--depth, picked per decoder from timings)")
    add_decoding_arguments(parser, max_new_tokens=BenchSettings().decode.max_new_tokens)
    add_reranker_argument(parser)
    parser.add_argument("--no-hf", dest="hf", action="store_false",
                        help="skip the Hugging Face baselines")
    parser.add_argument("--assistant", default=None, metavar="DIR",
                        help="standalone draft model (folder, .gguf, hub id) for Hugging Face "
                        "assisted generation, e.g. a distilled draft beside an EAGLE-3 head "
                        "--draft; default: --draft when it is a standalone model")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                        help="another engine, timed as method peer:NAME: a command speaking the "
                        "JSON-lines protocol of targetrows.bench.peer, e.g. vllm='/opt/vllm/bin/"
                        "python benchmarks/vllm_peer.py --target T --draft D' (repeatable)")
    parser.add_argument("--prompt-lookup-tokens", type=int,
                        default=BenchSettings.prompt_lookup_tokens, metavar="N",
                        help="candidates per round of Hugging Face prompt lookup decoding")
    add_batch_argument(parser)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--name", default=None, help="file stem (default: bench_<date-time>)")
    parser.add_argument("--note", default="", help="a line for the report's header")


def _questions(args) -> list[tuple[str, str, str]]:
    """(question_id, category, first user message) of each prompt to time."""
    from targetrows.specbench.questions import read_questions

    if args.prompts:
        if args.num_prompts is not None:
            check_count(args.num_prompts, "--num-prompts")
        questions = [q for path in args.prompts
                     for q in read_questions(path)[: args.num_prompts]]
        items = [(str(q.question_id), q.category, q.turns[0]) for q in questions]
    else:
        items = [(f"prompt-{i}", "", text) for i, text in enumerate(args.prompt)]
    for qid, _, text in items:
        if not text.strip():
            raise ValueError(f"prompt {qid} is empty: give the text of a user message")
    return items


def _load_assistant(args, tokenizer):
    """The --assistant model, loaded as `load_pair` loads a standalone draft (the draft's
    device, trust and dtype), after checking it is no EAGLE-3 head and shares the tokenizer."""
    from targetrows.heads.checkpoint import head_config
    from targetrows.hf.loading import (
        draft_dtype_for,
        load_model,
        load_tokenizer,
        resolve_device,
        tokenizer_difference,
        trusts,
    )

    path = args.assistant
    if head_config(path) is not None:
        raise ValueError(
            f"--assistant {path!r} is an EAGLE-3 head, which Hugging Face assisted generation "
            "cannot run; give a standalone draft model (its own weights and tokenizer)"
        )
    trust = trusts(args.trust_remote_code, "draft")
    own = load_tokenizer(path, trust, allow_pickle=args.allow_pickle)
    difference = tokenizer_difference(tokenizer, own)
    if difference:
        raise ValueError(
            f"--assistant {path!r} has another tokenizer than target {args.target!r} "
            f"({difference}); assisted generation needs the target's tokenizer"
        )
    device = args.draft_device or resolve_device(args.target_device)
    dtype = draft_dtype_for(args.dtype, args.draft_dtype, device)
    assistant, _ = load_model(path, device, dtype, trust, args.allow_pickle,
                              tokenizer=tokenizer, packed=not args.plain_linears)
    return assistant


def _progress(row) -> None:
    if "question_id" not in row:  # a batched bench's row: every prompt of one method
        print(f"T={row['temperature']:g} {row['method']:>16}: {row['new_tokens']:5d} tokens "
              f"{row['tokens_per_s']:8.1f} tokens/s", file=sys.stderr, flush=True)
        return
    print(f"{row['question_id']:>12} T={row['temperature']:g} {row['method']:>16}: "
          f"{row['new_tokens']:4d} tokens {row['tokens_per_s']:8.1f} tokens/s",
          file=sys.stderr, flush=True)


def _run_with_peers(args, target, draft, prompts, settings, assistant):
    """`run_bench` with the --peer engines started (after our models: each loads while nothing
    else runs) and stopped around it; the context names each peer's engine."""
    from targetrows.bench.run import run_bench

    specs = [PeerSpec.parse(text) for text in args.peer]
    if len({s.name for s in specs}) != len(specs):
        raise ValueError("--peer: two peers with one name; name each NAME=COMMAND apart")
    logs = tempfile.mkdtemp(prefix="targetrows-peers-") if specs else None
    with contextlib.ExitStack() as stack:
        peers = {}
        for spec in specs:
            print(f"starting peer {spec.name} (its log: {logs}/{spec.name}.log)", file=sys.stderr)
            peers[spec.method] = stack.enter_context(
                Peer(spec, os.path.join(logs, f"{spec.name}.log")))
        rows, context = run_bench(target, draft, prompts, settings, _progress,
                                  assistant=assistant, peers=peers)
        context["peers"] = {m: f"{p.engine} {p.config}" for m, p in peers.items()}
    return rows, context


def _run_batched(args, target, draft, prompts, settings, command: str) -> int:
    from targetrows.bench import batched, report

    rows = batched.run_batched_bench(target, draft, prompts, settings, _progress)
    head = report.header(settings, target, draft, len(prompts), command=command, note=args.note)
    paths = batched.write(args.out_dir, args.name, rows, head)
    print(batched.markdown(head, rows))
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from targetrows.bench import report
    from targetrows.bench.plan import BenchPrompt
    from targetrows.specbench.chat import encode_prompt, stop_ids

    from .common import load_from_args

    # assisted generation warns, every call, about its own internal generation config
    transformers.logging.set_verbosity_error()
    if args.threads is not None:
        torch.set_num_threads(check_count(args.threads, "--threads"))
    rerankers = rerankers_from(args)
    decoders = decoders_from(args, rerankers)
    settings = BenchSettings(  # checks budget, temperatures and decoders
        decode=decode_config(args, temperature=BenchSettings().decode.temperature),
        decoders=tuple(decoders),
        rerankers=rerankers,
        temperatures=tuple(args.temperature), budget=args.budget, hf=args.hf,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
    )
    check_draft(decoders, args.draft)
    batch_size = settings.decode.batch_size  # --batch-size
    if batch_size > 1 and (args.assistant or args.peer):
        raise ValueError("--batch-size above 1 compares with Hugging Face's batched generate "
                         "only: drop --assistant and --peer")
    if args.assistant and not args.hf:
        raise ValueError("--assistant only serves the Hugging Face baselines, which --no-hf "
                         "skips: drop one of the two")
    items = _questions(args)
    check_output_folder(args.out_dir, "--out-dir")  # before any model loads or pass runs
    target, draft, tokenizer = load_from_args(args)
    assistant = _load_assistant(args, tokenizer) if args.assistant else None
    prompts = [BenchPrompt(qid, cat, tuple(encode_prompt(tokenizer, text)))
               for qid, cat, text in items]
    stops = frozenset(stop_ids(tokenizer, target))
    settings = dataclasses.replace(settings, decode=dataclasses.replace(settings.decode,
                                                                        stop_ids=stops))

    prog = os.path.basename(sys.argv[0])
    prog = "targetrows" if prog in ("cli.py", "__main__.py") else prog  # python -m targetrows.cli
    command = shlex.join([prog, *sys.argv[1:]])
    if batch_size > 1:
        return _run_batched(args, target, draft, prompts, settings, command)
    rows, context = _run_with_peers(args, target, draft, prompts, settings, assistant)
    context["lookup"] = bool(args.draft_lookup)  # which goal over ar applies
    # quoted as a shell would need it: a --peer command or a --note is one argument
    head = report.header(settings, target, draft, len(prompts), command=command, note=args.note,
                         assistant=assistant, peers=context["peers"])
    paths = report.write(args.out_dir, args.name, rows, context, head, settings)
    print(report.summary_markdown(report.summarize(rows, settings), settings))
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0
