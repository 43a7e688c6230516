"""`targetrows decode`: prompts JSONL in, Spec-Bench answers out; resumable; bad input named."""

import json

import pytest

pytest.importorskip("torch")

from cli_in_process import run_cli
from tiny_models import save_tiny_pair

from targetrows.specbench.questions import read_questions

QUESTIONS = [
    {"question_id": "q1", "category": "writing", "turns": ["Write a haiku.", "Now shorter."]},
    {"question_id": 2, "category": "math", "turns": ["What is 2 + 2?"]},
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "qwen2")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def decode(capsys, pair, prompts, out, *extra):
    """`targetrows decode` of `prompts` into `out` (in this process: `cli_in_process`)."""
    target, draft = pair
    return run_cli(capsys, "decode", "--target", target, "--draft", draft, "--prompts",
                   str(prompts), "--out", str(out), "--max-new-tokens", "12", "--top-k", "4",
                   "--depth", "3", "--no-progress", *extra)


def test_answers_are_spec_bench_records(pair, prompts, tmp_path, capsys):
    out = tmp_path / "fts.jsonl"
    proc = decode(capsys, pair, prompts, out, "--decoder", "fts", "--budgets", "8", "4")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["question_id"], r["budget"]) for r in records] == [("q1", 8), (2, 8), ("q1", 4), (2, 4)]
    for r in records:
        choice = r["choices"][0]
        turns = 2 if r["question_id"] == "q1" else 1
        assert len(choice["turns"]) == len(choice["new_tokens"]) == turns
        assert choice["decoding_steps"] == [len(t) for t in _split(r)]
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
        assert [len(t) for t in r["token_ids"]] == choice["new_tokens"]
        assert r["model_id"] and r["category"] and r["decoder"] == "fts"
        assert max(r["rounds"]["nodes"]) <= r["budget"]
        assert r["depth"] == 3 and not r["budget_auto"]  # an integer budget runs at --depth
    assert not (tmp_path / "fts.jsonl.partial").exists()
    # ar's answers carry the same tokens: every decoder is lossless at temperature 0
    ar = tmp_path / "ar.jsonl"
    assert decode(capsys, pair, prompts, ar, "--decoder", "ar").returncode == 0
    ar_tokens = {r["question_id"]: r["token_ids"] for r in map(json.loads, ar.read_text().splitlines())}
    for r in records:
        assert r["token_ids"][0] == ar_tokens[r["question_id"]][0]


def _split(record):
    """Rounds per turn, from the flat per-round statistics."""
    counts, out, i = record["choices"][0]["decoding_steps"], [], 0
    for n in counts:
        out.append(record["rounds"]["committed"][i : i + n])
        i += n
    return out


def test_answers_at_batch_size_3_are_the_batch_1_answers(pair, prompts, tmp_path, capsys):
    """--batch-size 3 at temperature 1: the questions (one of two turns) at both budgets run
    three at a time, each answer with its batch-1 tokens (each its own derived seed), in the
    same order."""
    lines = {}
    for batch in ("1", "3"):
        out = tmp_path / f"batch{batch}.jsonl"
        proc = decode(capsys, pair, prompts, out, "--decoder", "recycle", "--budgets", "8", "4",
                      "--temperature", "1", "--batch-size", batch, "--dtype", "float32")
        assert proc.returncode == 0, proc.stderr
        lines[batch] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch_size"] for r in lines["3"]] == [3] * 4
    key = lambda r: (r["question_id"], r["budget"], r["token_ids"])  # noqa: E731
    assert [key(r) for r in lines["3"]] == [key(r) for r in lines["1"]]


@pytest.mark.parametrize("batch", [["--batch-size", "1"],
                                   ["--batch-size", "3", "--dtype", "bfloat16"]],
                         ids=["batch1", "batch3-bf16"])
def test_resume_gives_identical_answers(pair, prompts, tmp_path, batch, capsys):
    """In a batch, in bfloat16 too: the resumed run batches its answers as the full run did."""
    full = tmp_path / "full.jsonl"
    options = ["--decoder", "rerank", "--budgets", "6", "3", "--temperature", "1", *batch]
    assert decode(capsys, pair, prompts, full, *options).returncode == 0
    # an interrupted run: the first answer finished, the second torn mid-line
    resumed = tmp_path / "resumed.jsonl"
    first = full.read_text().splitlines()[0]
    (tmp_path / "resumed.jsonl.partial").write_text(first + "\n" + first[: len(first) // 2])
    assert decode(capsys, pair, prompts, resumed, *options).returncode == 0
    strip = lambda text: [  # noqa: E731 - wall times differ between runs, tokens must not
        (r["question_id"], r["token_ids"]) for r in map(json.loads, text.splitlines())
    ]
    assert strip(resumed.read_text()) == strip(full.read_text())


def test_resume_keeps_the_budget_auto_chose(pair, prompts, tmp_path, capsys):
    """`--budgets auto` times the machine, so two runs may choose differently: a resumed run
    takes the interrupted run's choice and keeps its answers."""
    full = tmp_path / "full.jsonl"
    proc = decode(capsys, pair, prompts, full, "--decoder", "fts", "--budgets", "auto")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in full.read_text().splitlines()]
    chosen, depth = records[0]["budget"], records[0]["depth"]
    assert all(r["budget"] == chosen and r["budget_auto"] for r in records)
    assert all(r["depth"] == depth for r in records)
    if chosen == 0:  # no tree beat ar on this machine (a tiny model's passes: likely)
        assert depth == 0 and "budget auto -> no tree, ar (best tree: " in proc.stderr
    else:
        assert 1 <= depth <= 3  # auto's own depth
        assert f"budget auto -> {chosen} at depth {depth} (" in proc.stderr
    # the interrupted run had chosen another budget (a tree) and finished its first answer
    other, depth = (2 if chosen != 2 else 3), depth or 3
    first = dict(records[0], budget=other, depth=depth)
    resumed = tmp_path / "resumed.jsonl"
    (tmp_path / "resumed.jsonl.partial").write_text(json.dumps(first) + "\n")
    proc = decode(capsys, pair, prompts, resumed, "--decoder", "fts", "--budgets", "auto")
    assert proc.returncode == 0, proc.stderr
    said = f"budget auto -> {other} at depth {depth}, as chosen by the interrupted run"
    assert said in proc.stderr
    out = [json.loads(line) for line in resumed.read_text().splitlines()]
    assert [r["budget"] for r in out] == [other] * len(records) and out[0] == first
    assert [r["token_ids"] for r in out] == [r["token_ids"] for r in records]  # T=0: lossless


def test_several_prompts_files_load_the_models_once_and_share_one_auto_pick(pair, prompts,
                                                                           tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"question_id": 7, "category": "qa", "turns": ["Why?"]}) + "\n")
    target, draft = pair
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    argv = ["decode", "--target", target, "--draft", draft, "--prompts", str(prompts), str(other),
            "--max-new-tokens", "8", "--top-k", "4", "--depth", "3", "--no-progress",
            "--decoder", "draft_rank", "--budgets", "5", "auto"]
    proc = run_cli(capsys, *argv, "--out", *map(str, outs))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("budget auto ->") == 1  # one pick for both files
    a, b = ([json.loads(line) for line in out.read_text().splitlines()] for out in outs)
    assert {r["question_id"] for r in a} == {"q1", 2} and {r["question_id"] for r in b} == {7}
    picks = {(r["budget"], r["depth"]) for r in a + b if r["budget_auto"]}
    runs = {(r["budget"], r["depth"]) for r in a}  # (one, should auto pick budget 5 at depth 3)
    assert len(picks) == 1 and len(a) == 2 * len(runs) and len(b) == len(runs)
    proc = run_cli(capsys, *argv, "--out", str(outs[0]))
    assert proc.returncode != 0 and "one answers file per prompts file" in proc.stderr


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2, "turns": []}\n', ":2: 'turns'"),
        ('{"question_id": 1, "turns": ["  "]}\n', ":1: turn 0 is empty"),
        ("not json\n", ":1: not valid JSON"),
        ('{"turns": ["hi"]}\n', "missing field 'question_id'"),
        ('{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n', "appears twice"),
    ],
)
def test_bad_prompt_files_are_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line)
    with pytest.raises(ValueError, match=message):
        read_questions(str(path))


def test_bad_prompts_fail_before_writing(pair, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    out = tmp_path / "out.jsonl"
    proc = decode(capsys, pair, path, out, "--decoder", "ar")
    assert proc.returncode == 2 and "bad.jsonl:1" in proc.stderr
    assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists()


def test_prompt_longer_than_the_context_window(pair, tmp_path, capsys):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"question_id": "long", "turns": ["x" * 1100]}) + "\n")
    proc = decode(capsys, pair, path, tmp_path / "o.jsonl", "--decoder", "ar")
    assert proc.returncode == 2 and "'long'" in proc.stderr and "context window" in proc.stderr


QWEN3_GENERATION_TAIL = (  # the end of Qwen3's chat template, where enable_thinking acts
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_thinking_off_renders_qwen3s_empty_think_block_and_on_leaves_it_to_the_model(tmp_path):
    """`set_thinking` reaches every prompt `encode_conversation` builds, through the template's
    own enable_thinking; None keeps the template's default; the decode command's --thinking
    sets it (its answers start from the prompt with the block)."""
    import json

    from tiny_models import save_tiny_pair, tiny_tokenizer

    from targetrows.cli import main
    from targetrows.specbench.chat import encode_conversation, set_thinking

    tok = tiny_tokenizer()
    tok.chat_template = QWEN3_GENERATION_TAIL
    default = tok.decode(encode_conversation(tok, [("user", "hi")]))
    set_thinking(tok, False)
    off = tok.decode(encode_conversation(tok, [("user", "hi")]))
    set_thinking(tok, True)
    on = tok.decode(encode_conversation(tok, [("user", "hi")]))
    assert off == default + "<think>\n\n</think>\n\n" and on == default
    set_thinking(tok, None)
    assert tok.decode(encode_conversation(tok, [("user", "hi")])) == default

    target, draft = save_tiny_pair(tmp_path, "llama")
    for folder in (target, draft):
        t = tiny_tokenizer()
        t.chat_template = QWEN3_GENERATION_TAIL
        t.save_pretrained(folder)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "mt_bench", "turns": ["hi"]}))
    answers = {}
    for thinking in ("on", "off"):
        out = tmp_path / f"{thinking}.jsonl"
        assert main(["decode", "--target", target, "--draft", draft, "--dtype", "float32",
                     "--prompts", str(prompts), "--decoder", "ar", "--max-new-tokens", "8",
                     "--thinking", thinking, "--no-progress", "--out", str(out)]) == 0
        answers[thinking] = json.loads(out.read_text())["token_ids"][0]
    assert answers["on"] != answers["off"]  # another prompt, another greedy continuation


def test_an_auto_pick_of_a_learned_decoder_calibrates_each_prompt_out_of_fold(tmp_path,
                                                                               monkeypatch):
    """The `auto` condition of lrerank calibrates each prompts file's first question with the
    fold model that never saw it, as decoding does, not with the model of every prompt."""
    import json

    from rerankers import RERANKERS

    from targetrows.core.rules.learned import Reranker
    from targetrows.decoding.budget import Auto
    from targetrows.decoding.config import DecodeConfig
    from targetrows.jobs import decode as job

    full = RERANKERS["learned_rerank"]
    folds = (tuple(w + 1.0 for w in full.weights), tuple(w - 1.0 for w in full.weights))
    model = Reranker(full.rule, full.features, full.weights, folds,
                     {"mt_bench/1": 0, "gsm8k/7": 1})
    files = []
    for task, qid in (("mt_bench", 1), ("gsm8k", 7)):
        path = tmp_path / f"{task}.jsonl"
        more = [{"question_id": 99, "category": task, "turns": ["x" * 40]}] if qid == 7 else []
        path.write_text("\n".join(json.dumps(q) for q in [
            {"question_id": qid, "category": task, "turns": ["hi"]}, *more]))
        files.append(job._open_file(str(path), str(tmp_path / f"{task}.out"),
                                    job.DecodeJobSettings(DecodeConfig("fts"))))
    seen = {}

    def fake_auto_budget(target, draft, config, prompts, prompt_configs=None, **kw):
        seen["weights"] = [c.reranker.weights for c in prompt_configs]
        seen["prompts"], seen["context_len"] = prompts, kw["context_len"]

        class Choice:
            budget, depth = 5, 2

            def describe(self):
                return "budget auto -> 5 at depth 2"

            def condition(self):
                return self.budget, self.depth
        return Choice()

    monkeypatch.setattr(job, "auto_budget", fake_auto_budget)

    class Tokenizer:
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [1] * len(text)}

    settings = job.DecodeJobSettings(DecodeConfig("lrerank", reranker=model, max_new_tokens=30),
                                     budgets=(Auto(),))
    assert job.auto_condition(None, None, Tokenizer(), files, settings) == (5, 2)
    assert seen["weights"] == [folds[0], folds[1]]
    # calibrated on each file's first question, timed at the mean context of every question
    hi, long = (len(job.encode_conversation(Tokenizer(), [("user", t)])) for t in ("hi", "x" * 40))
    assert [len(p) for p in seen["prompts"]] == [hi, hi]
    assert seen["context_len"] == round((2 * hi + long) / 3 + 15)


def test_an_auto_pick_of_no_tree_decodes_as_ar(tmp_path, monkeypatch):
    """Where no tree beats ar's one pass per token (a verify pass of n nodes far dearer than one
    node), `auto` picks no tree: the job decodes that condition with ar's config, its records
    say budget auto, budget 0, the job's decoder, and hold the target's greedy tokens; a resumed
    run keeps that choice."""
    import functools

    import numpy as np

    from targetrows.core.pool import PoolShape
    from targetrows.core.toy import ToyPair
    from targetrows.cost import calibration
    from targetrows.cost.parttimes import PartTimes, PassCurve
    from targetrows.decoding.budget import Auto, Fixed
    from targetrows.decoding.config import DecodeConfig
    from targetrows.jobs import decode as job

    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    dear = PartTimes(PassCurve((1, 2, 200), (0.01, 0.05, 7.97)), PassCurve((1,), (0.002,)), 3)
    monkeypatch.setattr(job, "auto_budget", functools.partial(calibration.auto_budget,
                                                              parts=dear))

    class Tokenizer:  # characters to toy token ids, ids back to letters
        chat_template, eos_token_id = None, None

        def __call__(self, text):
            return {"input_ids": [ord(c) % 24 for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i) for i in ids)

        def get_vocab(self):
            return {}

    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in [
        {"question_id": 1, "category": "writing", "turns": ["abc"]},
        {"question_id": 2, "category": "math", "turns": ["hello"]}]))
    out = tmp_path / "fts.jsonl"
    settings = job.DecodeJobSettings(
        DecodeConfig("fts", max_new_tokens=10, pool=PoolShape(4, 3)), budgets=(Fixed(4), Auto()),
        progress=False)
    job.answer_files(pair.target, pair.draft, Tokenizer(), [(str(prompts), str(out))], settings)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    auto = [r for r in records if r["budget_auto"]]
    assert [(r["budget"], r["depth"], r["decoder"]) for r in auto] == [(0, 0, "fts")] * 2
    assert [(r["draft_kind"], r["overlap"]) for r in auto] == [("none", False)] * 2
    for r in auto:  # ar's tokens: the target's greedy path, one pass (no tree) per token
        ctx = Tokenizer()(r["question_id"] == 1 and "abc" or "hello")["input_ids"]
        for _ in range(10):
            ctx.append(int(np.argmax(pair.target_row(ctx))))
        assert r["token_ids"][0] == ctx[-10:]
        assert max(r["rounds"]["nodes"]) == 0
    assert {(r["budget"], r["budget_auto"]) for r in records} == {(4, False), (0, True)}
    # a resumed run keeps the interrupted run's choice, whatever the timings say now
    monkeypatch.setattr(job, "auto_budget", None)  # would fail if called
    (tmp_path / "fts.jsonl.partial").write_text(json.dumps(auto[0]) + "\n")
    files = [job._open_file(str(prompts), str(out), settings)]
    assert job.auto_condition(pair.target, pair.draft, Tokenizer(), files, settings) == (0, 0)
