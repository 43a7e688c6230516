"""Chat prompts for distillation, generated offline: many different requests, no dataset needed.

A draft distilled on a few hundred prompts memorises them (train agreement far above held-out
agreement; 384 prompts gave 0.20 held-out top-1 agreement where 1,024 gave 0.26), so variety
matters more than anything else. `training_prompts` builds about 11,000 distinct requests from
templates written for this project (topics x tasks, comparisons, code, arithmetic word problems,
rewriting, translation, role play, short passages to summarise) and interleaves the kinds so any
prefix is a balanced mix. `HELDOUT_PROMPTS` are hand-written, in wordings no template produces;
they are only for measuring agreement.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

_DATA = json.loads((Path(__file__).with_name("chat_prompts.json")).read_text(encoding="utf-8"))
TOPICS: dict[str, list[str]] = _DATA["topics"]  # topic group -> topics
TOPIC_TASKS, AUDIENCES, COMPARE = _DATA["topic_tasks"], _DATA["audiences"], _DATA["compare"]
LANGUAGES, CODE_TASKS, CODE_FORMS = _DATA["languages"], _DATA["code_tasks"], _DATA["code_forms"]
REWRITE, SENTENCES, TRANSLATE_TO = _DATA["rewrite"], _DATA["sentences"], _DATA["translate_to"]
ROLES, ROLE_ASKS = _DATA["roles"], _DATA["role_asks"]
ITEMS, NAMES, CITIES, JOBS, HOBBIES = (_DATA[k] for k in ("items", "names", "cities", "jobs",
                                                         "hobbies"))
# hand-written, in wordings no template produces: only for measuring agreement
HELDOUT_PROMPTS = tuple(_DATA["heldout_prompts"])


def _math(rng: random.Random) -> list[str]:
    """Arithmetic and word problems; numbers are drawn once from the generator's seed."""
    out = []
    for name, item in itertools.product(NAMES, ITEMS):
        n, price, more = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 7)
        out.append(f"{name} buys {n} {item} at ${price} each and then {more} more. "
                   "How much did they spend in total? Explain step by step.")
    for _ in range(300):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(100, 999)
        out.append(rng.choice([f"What is {a} times {b}?", f"Solve for x: {a}x + {b} = {c}.",
                               f"What is {a}% of {c}?", f"Is {c} divisible by {a % 9 + 2}? Why?",
                               f"A train travels {c} km in {a % 9 + 2} hours. What is its "
                               "average speed?"]))
    return sorted(set(out))


def _passages() -> list[str]:
    """Short made-up biographies to summarise or question: names x jobs x cities x hobbies."""
    out = []
    for name, job, city, hobby in itertools.product(NAMES, JOBS, CITIES, HOBBIES):
        article = "an" if job[0] in "aeiou" else "a"
        bio = (f"{name} is {article} {job} who lives in {city}. After work, {name} spends most "
               f"evenings on {hobby}, and last year won a local prize for it.")
        ask = ["Summarize this in one sentence:", "What is this person's job and hobby?",
               "Write a friendly reply to this introduction:"][len(out) % 3]
        out.append(f"{ask}\n\n{bio}")
    return out


def _kinds(rng: random.Random) -> list[list[str]]:
    """Every prompt of each kind, each list deterministic given `rng`."""
    topics = [t for group in TOPICS.values() for t in group]
    per_topic = [task.format(t=t, a=a) for task, t in itertools.product(TOPIC_TASKS, topics)
                 for a in ([rng.choice(AUDIENCES)] if "{a}" in task else [""])]
    pairs = [(a, b) for group in TOPICS.values() for a, b in itertools.combinations(group, 2)]
    compare = [form.format(a=a, b=b) for a, b in pairs for form in [rng.choice(COMPARE)]]
    code = [f.format(lang=lang, task=task)
            for f, lang, task in itertools.product(CODE_FORMS, LANGUAGES, CODE_TASKS)]
    rewrite = [r.format(s=s, lang=lang) for r, s in itertools.product(REWRITE, SENTENCES)
               for lang in (TRANSLATE_TO if "{lang}" in r else [""])]
    roles = [f"You are a {role}. " + ask.format(t=rng.choice(topics))
             for role, ask in itertools.product(ROLES, ROLE_ASKS)]
    return [per_topic, compare, code, _math(rng), rewrite, roles, _passages()]


# how many prompts of each kind (in `_kinds` order) one round of the interleaving takes
WEIGHTS = (6, 2, 2, 1, 1, 1, 1)


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct training prompts, a balanced mix of kinds; the same `n`, `seed` give the same
    list, and a larger `n` extends a smaller one."""
    rng = random.Random(seed)
    pools = _kinds(rng)
    for pool in pools:
        rng.shuffle(pool)
    seen = set(HELDOUT_PROMPTS)
    out: list[str] = []
    cursors = [0] * len(pools)
    while len(out) < n and any(c < len(p) for c, p in zip(cursors, pools, strict=True)):
        for k, (pool, weight) in enumerate(zip(pools, WEIGHTS, strict=True)):
            for _ in range(weight):
                while cursors[k] < len(pool) and pool[cursors[k]] in seen:
                    cursors[k] += 1
                if cursors[k] < len(pool) and len(out) < n:
                    seen.add(pool[cursors[k]])
                    out.append(pool[cursors[k]])
    if len(out) < n:
        raise ValueError(f"asked for {n} training prompts but only {len(out)} distinct ones "
                         "exist; lower --prompts")
    return out


def all_training_prompts(seed: int = 0) -> set[str]:
    """Every prompt `training_prompts` can return (for checking the held-out set is disjoint)."""
    return {p for pool in _kinds(random.Random(seed)) for p in pool}
