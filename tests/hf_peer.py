"""A peer engine for tests (the JSON-lines protocol of `targetrows.bench.peer`): greedy or sampled
decoding by a plain token-by-token loop over a Hugging Face causal LM with its own cache, written
without targetrows, so that the bench's peer plumbing is checked against an independent engine.

    python tests/hf_peer.py MODEL_FOLDER [--fail-after N]
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def generate(model, vocab: int, request: dict) -> list[int]:
    torch.manual_seed(request["seed"])
    ids = torch.tensor([request["ids"]])
    out, past = [], None
    with torch.inference_mode():
        for _ in range(request["max_new_tokens"]):
            step = model(ids, past_key_values=past, use_cache=True)
            # rows past the tokenizer's vocabulary are padding, never a token
            past, logits = step.past_key_values, step.logits[0, -1, :vocab].float()
            if request["temperature"] > 0:
                probs = torch.softmax(logits / request["temperature"], dim=-1)
                token = int(torch.multinomial(probs, 1))
            else:
                token = int(torch.argmax(logits))
            out.append(token)
            if token in request["stop_ids"]:
                break
            ids = torch.tensor([[token]])
    return out


def main() -> None:
    folder = sys.argv[1]
    fail_after = int(sys.argv[sys.argv.index("--fail-after") + 1]) if "--fail-after" in sys.argv \
        else None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vocab = len(AutoTokenizer.from_pretrained(folder))
    print(json.dumps({"ready": True, "engine": "hf-loop", "config": {"model": folder}}),
          flush=True)
    for n, line in enumerate(sys.stdin):
        if fail_after is not None and n >= fail_after:
            print(json.dumps({"error": "out of memory (pretend)"}), flush=True)
            continue
        start = time.perf_counter()
        tokens = generate(model, vocab, json.loads(line))
        print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
    main()
