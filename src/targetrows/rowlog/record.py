"""`targetrows record`: decode each prompt with the target alone and log its rows along the way.

At every stride-th position t of the target's own trajectory (greedy at temperature 0, sampled
otherwise, seeded per prompt) the draft expands its candidate pool at the context c_t and one
tree-attention pass of the target over the pool gives every edge probability and the root row
(the same pass also yields the next trajectory token). With stride > 1 the pool at c_{t+1} is
logged too, for `first_token_redraft`. At every prompt and trajectory position the target's top
ids are kept, for the draft-free decoders (`targetrows.rowlog.draft_free`). The log format:
`targetrows.rowlog.format`.

Recording resumes per question: each finished question is written to ``OUT.parts/NNNNNN.npz``
(temporary name, then rename); when all are there they are merged into OUT atomically and the
parts folder is removed. Only a finished log carries the completion marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from targetrows.core.atomic import remove_stale_temps
from targetrows.core.checks import check_count, check_temperature
from targetrows.core.pool import PoolShape, expand_model
from targetrows.core.tree import Tree
from targetrows.decoding.model import draft_kind, edge_probs
from targetrows.decoding.planners import prompt_rows
from targetrows.rowlog import format as rowlog
from targetrows.specbench.questions import check_prompt, read_questions


@dataclass(frozen=True)
class RecordConfig:
    temperature: float = 0.0
    pool: PoolShape = field(default_factory=PoolShape)  # the pools logged
    stride: int = 1
    max_new_tokens: int = 128  # scored positions per turn (the trajectory runs depth further)
    root_top: int = 32  # root-row entries kept besides the first-level pool tokens
    path_top_k: int = 8  # the target's top ids kept at every prompt and trajectory position
    seed: int = 0
    stop_ids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self):
        check_temperature(self.temperature)
        for name in ("stride", "max_new_tokens", "root_top", "path_top_k"):
            check_count(getattr(self, name), name)

    def header(self) -> dict:
        """The settings a row log's header records (`targetrows.rowlog.format`)."""
        return dict(temperature=self.temperature, top_k=self.pool.top_k, depth=self.pool.depth,
                    stride=self.stride, max_new_tokens=self.max_new_tokens,
                    root_top=self.root_top, path_top_k=self.path_top_k, seed=self.seed,
                    stop_ids=sorted(int(t) for t in self.stop_ids))


def record_prompt(target, draft, prompt_ids: Sequence[int], config: RecordConfig,
                  seed: int | None = None) -> dict:
    """Record one prompt (any pair implementing `targetrows.decoding.model.Model`).

    Returns a segment dict: prompt, trajectory, stopped, records (one dict per logged pool, see
    `rowlog.from_segments`), and the target's top `config.path_top_k` ids at every prompt and
    trajectory position (prompt_topk, traj_topk). `seed` (default ``config.seed``) seeds the
    target's sampling.
    """
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty: it needs at least one token")
    seed = config.seed if seed is None else seed
    target.reset(seed)
    draft.reset(seed)
    ctx = list(prompt)
    k = min(config.path_top_k, target.vocab_size)
    prompt_topk = prompt_rows(target, prompt, k)[0]  # one pass, its entries committed
    prev_root = None  # the target's row at the previous context (for stale_rerank)
    if len(ctx) >= 2:
        prev_root = target.logits(ctx[:-1], Tree.root_only(ctx[-2]), [0])
        target.commit(ctx[:-1])
    n, stride = config.max_new_tokens, config.stride
    trajectory, traj_topk, records, stopped = [], [], [], False
    for t in range(n + config.pool.depth):
        scored = t % stride == 0 and t < n
        if scored or (1 <= t <= n and (t - 1) % stride == 0):
            rec, root = _pool_record(target, draft, ctx, prev_root, config)
            records.append(dict(rec, position=t, scored=scored))
        else:
            root = target.logits(ctx, Tree.root_only(ctx[-1]), [0])
        token = int(target.draw(root, config.temperature)[0])
        trajectory.append(token)
        traj_topk.append(target.topk(root, k)[0][0])
        ctx.append(token)
        target.commit(ctx)
        draft.commit(ctx)
        prev_root = root
        if token in config.stop_ids:
            stopped = True
            break
    return dict(prompt=prompt, trajectory=trajectory, stopped=stopped, records=records,
                prompt_topk=prompt_topk, traj_topk=np.reshape(traj_topk, (len(trajectory), k)))


def _pool_record(target, draft, ctx: list[int], prev_root, config: RecordConfig):
    """The pool at `ctx`, its edge probabilities and the sparse root row: one target pass."""
    temperature = config.temperature
    tree, logq = expand_model(draft, ctx, config.pool.top_k, config.pool.depth)
    heads = np.unique(tree.parents[1:])  # nodes with children (0 first): the only rows needed
    rows = target.logits(ctx, tree, heads)
    edge_p = edge_probs(target, rows, heads, tree, temperature)

    root = rows[0:1]
    first_tokens = tree.tokens[tree.children(0)]
    top, _ = target.topk(root, config.root_top)
    root_tokens = np.concatenate([top[0], first_tokens[~np.isin(first_tokens, top[0])]])
    root_p = np.exp(target.logprobs(root, root_tokens[None], temperature)[0])
    if prev_root is None:
        stale_p = np.full(len(first_tokens), np.nan)
    else:
        stale_p = np.exp(target.logprobs(prev_root, first_tokens[None], temperature)[0])
    rec = dict(tokens=tree.tokens, parents=tree.parents, logq=logq, edge_p=edge_p,
               stale_p=stale_p, root_tokens=root_tokens, root_p=root_p)
    return rec, root


# -- prompts ----------------------------------------------------------------------------------


def read_prompts(path: str) -> list[dict]:
    """Spec-Bench question records (question_id, category, turns); errors name file and line."""
    return [asdict(q) for q in read_questions(path)]


class ToyEncoder:
    """Text -> toy token ids: UTF-8 bytes modulo the vocabulary; answers are kept as ids."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, turns: list[str], answers: list[list[int]]) -> list[int]:
        ids: list[int] = []
        for i, turn in enumerate(turns):
            ids += [b % self.vocab_size for b in turn.encode()]
            if i < len(answers):
                ids += answers[i]
        return ids


class ChatEncoder:
    """Text -> ids through the tokenizer's chat template; earlier answers are decoded to text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, turns: list[str], answers: list[list[int]]) -> list[int]:
        from targetrows.specbench.chat import encode_conversation

        messages = []
        for i, turn in enumerate(turns):
            messages.append(("user", turn))
            if i < len(answers):
                text = self.tokenizer.decode(answers[i], skip_special_tokens=True)
                messages.append(("assistant", text))
        return encode_conversation(self.tokenizer, messages)


def question_seed(seed: int, question: int, turn: int) -> int:
    """Each turn's own seed, so a resumed recording draws exactly what a fresh one would."""
    return int(np.random.SeedSequence([seed, question, turn]).generate_state(1)[0])


def record_question(target, draft, encoder, item: dict, index: int,
                    config: RecordConfig) -> list[dict]:
    """Every turn of one question; a later turn's prompt holds the earlier turns' answers."""
    segments, answers = [], []
    for turn in range(len(item["turns"])):
        ids = encoder.encode(item["turns"][: turn + 1], answers)
        check_turn(target, draft, item, turn, ids, config)
        try:
            seg = record_prompt(target, draft, ids, config, question_seed(config.seed, index, turn))
        except ValueError as err:  # e.g. NaN logits: say which prompt
            raise ValueError(f"question {item['question_id']!r} turn {turn}: {err}") from err
        answer = seg["trajectory"][: config.max_new_tokens]
        answers.append([t for t in answer if t not in config.stop_ids])
        segments.append(dict(seg, question=item["question_id"], task=item["category"], turn=turn))
    return segments


def check_turn(target, draft, item: dict, turn: int, ids, config: RecordConfig) -> None:
    """The trajectory runs max_new_tokens + depth tokens and pools reach depth further."""
    check_prompt(item["question_id"], turn, ids, (target, draft),
                 config.max_new_tokens + config.pool.depth,
                 "shorten the prompt or lower --max-new-tokens / --depth")


def record_file(target, draft, encoder, prompts_path: str, out: str, config: RecordConfig,
                names: tuple[str, str] = ("target", "draft"), quiet: bool = False) -> rowlog.RowLog:
    """Record every question of `prompts_path` into the row log `out`, resuming from its parts."""
    prompts = read_prompts(prompts_path)
    with open(prompts_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    settings = json.loads(json.dumps(dict(
        target=names[0], draft=names[1], draft_kind=draft_kind(draft),
        prompts=prompts_path, prompts_sha256=digest,
        n_questions=len(prompts), vocab_size=int(target.vocab_size), **config.header(),
    )))
    for item in prompts:  # first turns too long for the models fail before anything is written
        check_turn(target, draft, item, 0, encoder.encode(item["turns"][:1], []), config)
    remove_stale_temps(out)  # a run killed while writing the log (SIGKILL) left its temp file
    parts_dir = out + ".parts"  # made with the first part: a failed start leaves nothing
    parts = []
    for q, item in enumerate(prompts):
        part = os.path.join(parts_dir, f"{q:06d}.npz")
        parts.append(part)
        if os.path.exists(part):
            _check_part(part, settings, q)
            continue
        start = time.perf_counter()
        segments = record_question(target, draft, encoder, item, q, config)
        os.makedirs(parts_dir, exist_ok=True)
        rowlog.write(part, rowlog.from_segments(dict(settings, complete=False, part=q), segments))
        if not quiet:
            n_pos = sum(int(sum(r["scored"] for r in s["records"])) for s in segments)
            print(f"record: question {q + 1}/{len(prompts)} ({item['question_id']}): "
                  f"{n_pos} positions in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    log = rowlog.concat([rowlog.read(p, require_complete=False) for p in parts],
                        dict(settings, complete=True, part=None))
    rowlog.write(out, log)
    shutil.rmtree(parts_dir)
    return log


def _check_part(path: str, settings: dict, index: int) -> None:
    try:
        header = rowlog.read(path, require_complete=False).header
    except ValueError as err:
        raise ValueError(f"{err} (delete part file {path} and rerun: that question is "
                         "recorded again)") from err
    for key in rowlog.SETTINGS:
        if header.get(key) != settings.get(key):
            raise ValueError(
                f"part file {path} was recorded with {key}={header.get(key)!r}, this run has "
                f"{settings.get(key)!r}: delete the folder {os.path.dirname(path)} to start over"
            )
    if header.get("part") != index:
        raise ValueError(f"part file {path} holds question {header.get('part')}, not {index}")


# -- command line -----------------------------------------------------------------------------


