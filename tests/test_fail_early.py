"""Fail early and fail alone: outputs, limits and devices are checked before any model pass, a
sequence that fails never takes its batch neighbours with it, and every bad input is an error
that names it (exit 2, no traceback)."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli_in_process import run_cli  # noqa: E402
from test_batch import HF_PROMPTS, _configs, _one_by_one  # noqa: E402
from test_decoders_hf import hf_greedy, noisy_copy  # noqa: E402
from tiny_models import save_tiny_pair, tiny_model  # noqa: E402

from targetrows.core.pool import PoolShape  # noqa: E402
from targetrows.decoding.batch import generate_batch  # noqa: E402
from targetrows.decoding.loop import decode_passes  # noqa: E402
from targetrows.decoding.schedule import run_batched  # noqa: E402
from targetrows.hf.kv_cache import CapacityError  # noqa: E402
from targetrows.hf.lanes import Lanes  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.pass_builder import PassShape  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    target = tiny_model("llama", seed=0, n_layers=2, dtype=torch.float64)
    return target, noisy_copy(target, 0.01, seed=2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "qwen2")


@pytest.mark.parametrize("shape", [PassShape(capacity=40), PassShape(capacity=40, pad=True,
                                                                     full_span=True)],
                         ids=["unpadded", "padded"])
def test_a_sequence_past_the_cache_fails_alone(llama, shape):
    """Batch 3, five jobs: the second outgrows its 40 entries mid-decode (a 14-token prompt
    and 30 new tokens) while the others share its passes: they finish with their batch-1
    tokens, every one handed over, and the call raises the long one's CapacityError, saying
    how many failed."""
    target_hf, draft_hf = llama
    target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    target.set_pass_shape(shape), draft.set_pass_shape(shape)
    prompts = [[5, 6], HF_PROMPTS[5], [7], [8, 9, 10], [11]]
    configs = _configs("fts", 5, pool=PoolShape(top_k=3, depth=2))
    configs[1] = configs[1].__class__(**{**configs[1].__dict__, "max_new_tokens": 30,
                                          "stop_ids": frozenset()})
    eager = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    want = _one_by_one(*eager, [prompts[i] for i in (0, 2, 3, 4)],
                       [configs[i] for i in (0, 2, 3, 4)])
    done, failed = {}, []
    jobs = [lambda t, d, p=p, c=c: decode_passes(t, d, p, c)
            for p, c in zip(prompts, configs, strict=True)]
    with pytest.raises(CapacityError, match="--max-context") as raised:
        run_batched(target, draft, jobs, 3, on_done=lambda j, r: done.update({j: r.tokens}),
                    on_failed=lambda j, e: failed.append(j))
    assert failed == [1] and sorted(done) == [0, 2, 3, 4]
    assert [done[j] for j in (0, 2, 3, 4)] == want
    assert "1 of 5 jobs failed" in " ".join(raised.value.__notes__)


def test_a_batch_with_a_prompt_past_the_first_cache_size(llama):
    """A 300-token prompt beside short ones at batch 3: the cache (256 entries at first) grows
    as its first pass needs, and every sequence gives Hugging Face greedy's tokens."""
    target_hf, draft_hf = llama
    target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    long = [(7 * i) % 250 + 3 for i in range(300)]
    prompts = [HF_PROMPTS[0], long, HF_PROMPTS[3]]
    configs = _configs("draft_rank", 3, pool=PoolShape(top_k=3, depth=2))
    got = generate_batch(target, draft, prompts, configs, 3)
    for result, prompt in zip(got, prompts, strict=True):
        assert result.tokens == hf_greedy(target_hf, prompt, 27)[: len(result.tokens)]


def _no_passes(monkeypatch):
    """Any model pass from now on fails the test: what is checked up front must not need one."""
    def refused(passes, feeds):
        raise AssertionError("a model pass ran before the check")
    monkeypatch.setattr(Lanes, "run_batch", refused)


def _prompts_file(tmp_path, questions):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return path


QUESTIONS = [{"question_id": "q1", "turns": ["Say hello."]},
             {"question_id": 2, "turns": ["What is 2 + 2?"]}]


def test_a_prompt_past_max_context_is_refused_before_any_pass(pair, tmp_path, capsys,
                                                              monkeypatch):
    target, draft = pair
    prompts = _prompts_file(tmp_path, QUESTIONS + [{"question_id": 3, "turns": ["x " * 40]}])
    _no_passes(monkeypatch)
    proc = run_cli(capsys, "decode", "--target", target, "--draft", draft, "--prompts",
                   str(prompts), "--out", str(tmp_path / "a.jsonl"), "--decoder", "fts",
                   "--max-context", "60", "--max-new-tokens", "8", "--no-progress")
    assert proc.returncode == 2
    assert "question 3" in proc.stderr and "--max-context" in proc.stderr
    assert not list(tmp_path.glob("a.jsonl*"))


@pytest.mark.parametrize("command, option, kind", [("decode", "--out", "dir"),
                                                   ("bench", "--out-dir", "file")])
def test_an_output_of_the_wrong_kind_is_refused_before_any_pass(pair, tmp_path, capsys,
                                                               monkeypatch, command, option,
                                                               kind):
    target, draft = pair
    prompts = _prompts_file(tmp_path, QUESTIONS)
    where = tmp_path / "out"
    where.mkdir() if kind == "dir" else where.write_text("")
    _no_passes(monkeypatch)
    extra = (["--decoder", "ar"] if command == "decode"
             else ["--decoders", "ar", "--no-hf", "--name", "x"])
    proc = run_cli(capsys, command, "--target", target, "--draft", draft, "--prompts",
                   str(prompts), option, str(where), "--max-new-tokens", "4", *extra)
    assert proc.returncode == 2 and option in proc.stderr, proc.stderr
    assert ("is a folder" if kind == "dir" else "is a file") in proc.stderr


def test_an_answers_file_in_a_missing_folder_is_made_there(pair, tmp_path, capsys):
    target, _ = pair
    out = tmp_path / "new" / "deeper" / "ar.jsonl"
    proc = run_cli(capsys, "decode", "--target", target, "--prompts",
                   str(_prompts_file(tmp_path, QUESTIONS)), "--out", str(out), "--decoder",
                   "ar", "--max-new-tokens", "4", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2


def test_a_resumed_run_reruns_only_the_unfinished_questions(pair, tmp_path, capsys,
                                                            monkeypatch):
    """Batch 1, four questions at two budgets (eight answers), six of them finished by an
    interrupted run: the resumed run decodes two."""
    from targetrows.jobs import decode as job

    target, draft = pair
    questions = [{"question_id": i, "turns": [f"Count to {i}."]} for i in range(4)]
    prompts = _prompts_file(tmp_path, questions)
    options = ["--target", target, "--draft", draft, "--prompts", str(prompts), "--decoder",
               "fts", "--budgets", "6", "3", "--max-new-tokens", "6", "--no-progress"]
    full = tmp_path / "full.jsonl"
    assert run_cli(capsys, "decode", *options, "--out", str(full)).returncode == 0
    lines = full.read_text().splitlines()
    resumed = tmp_path / "resumed.jsonl"
    (tmp_path / "resumed.jsonl.partial").write_text("\n".join(lines[:6]) + "\n")
    decoded = []
    real = job.decode_question

    def counted(target, draft, tokenizer, question, config, state=None):
        decoded.append(question.question_id)
        return (yield from real(target, draft, tokenizer, question, config, state))

    monkeypatch.setattr(job, "decode_question", counted)
    assert run_cli(capsys, "decode", *options, "--out", str(resumed)).returncode == 0
    assert len(decoded) == 2
    tokens = [(r["question_id"], r["budget"], r["token_ids"])
              for r in map(json.loads, resumed.read_text().splitlines())]
    assert tokens == [(r["question_id"], r["budget"], r["token_ids"])
                      for r in map(json.loads, lines)]


@pytest.mark.parametrize("question_id", [None, "", "  ", 1.5, True, [1], {"a": 1}])
def test_a_question_without_a_usable_id_is_refused_with_its_line(tmp_path, question_id):
    from targetrows.specbench.questions import read_questions

    path = _prompts_file(tmp_path, [QUESTIONS[0], {"question_id": question_id,
                                                   "turns": ["Hi."]}])
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: question_id must be"):
        read_questions(str(path))


BAD_INPUTS = [  # (command's arguments after the pair's, what the error names)
    (["decode", "--decoder", "fts", "--budgets", "-1"], "--budgets"),
    (["decode", "--decoder", "fts", "--batch-size", "0"], "--batch-size"),
    (["decode", "--decoder", "fts", "--max-context", "1"], "--max-context"),
    (["decode", "--decoder", "fts", "--temperature", "-2"], "--temperature"),
    (["decode", "--decoder", "fts", "--graphs", "on"], "--graphs on"),
    (["decode", "--decoder", "fts", "--target-device", "cuda"], "cuda"),
    (["decode", "--decoder", "fts", "--target-device", "cuda:3"], "cuda"),
    (["decode", "--decoder", "fts", "--top-k", "0"], "--top-k"),
    (["decode", "--decoder", "fts", "--depth", "0"], "--depth"),
    (["decode", "--decoder", "fts", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["decode", "--decoder", "fts", "--prompts", "missing.jsonl"], "missing.jsonl"),
    (["decode", "--decoder", "fts", "--prompts", "{bad}"], "not valid JSON"),
    (["decode", "--decoder", "fts", "--prompts", "{nullid}"], "question_id"),
    (["decode", "--decoder", "fts", "--out", "a.jsonl", "b.jsonl"], "--out"),
    (["decode", "--decoder", "fts", "--dtype", "float8"], "--dtype"),
    (["compare", "--budget", "0"], "--budget"),
    (["compare", "--prompt", " "], "--prompt"),
    (["compare", "--json", "{dir}"], "--json"),
    (["bench", "--decoders", "ar", "--out-dir", "{file}"], "--out-dir"),
    (["bench", "--decoders", "nonsense"], "nonsense"),
    (["record", "--out", "{dir}"], "--out"),
]


@pytest.mark.parametrize("args, named", BAD_INPUTS,
                         ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_a_bad_input_is_an_error_that_names_it(pair, tmp_path, capsys, monkeypatch, args,
                                               named):
    """Each: exit 2 (argparse's refusals too), a message naming the input, no traceback (the
    in-process call returns), and no model pass."""
    target, draft = pair
    good = _prompts_file(tmp_path, QUESTIONS)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "nullid.jsonl").write_text(json.dumps({"question_id": None, "turns": ["a"]}))
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    fill = {"{bad}": str(tmp_path / "bad.jsonl"), "{nullid}": str(tmp_path / "nullid.jsonl"),
            "{dir}": str(tmp_path / "dir"), "{file}": str(tmp_path / "file")}
    args = [fill.get(a, a) for a in args]
    command, rest = args[0], args[1:]
    defaults = {"decode": ["--prompts", str(good), "--out", str(tmp_path / "o.jsonl"),
                           "--no-progress"],
                "compare": ["--prompt", "Hi."], "bench": ["--prompts", str(good)],
                "record": ["--prompts", str(good), "--out", str(tmp_path / "r.npz")]}[command]
    given = {a for a in rest if a.startswith("--")}
    for i in range(0, len(defaults)):  # the command's defaults, unless the case gives them
        if defaults[i] in given:
            defaults[i] = None
            if i + 1 < len(defaults) and not defaults[i + 1].startswith("--"):
                defaults[i + 1] = None
    _no_passes(monkeypatch)
    proc = run_cli(capsys, command, "--target", target, "--draft", draft,
                   *[a for a in defaults if a is not None], *rest)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert named in proc.stderr and "Traceback" not in proc.stderr
