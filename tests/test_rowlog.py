"""Row logs: what `record` logs (checked against the models' own rows), the file format's round
trip, damage detection, and resuming an interrupted recording."""

import json
import os

import numpy as np
import pytest

import targetrows.rowlog.record as record
from targetrows.cli import main
from targetrows.core import pool
from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.core.tree import Tree
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.record import RecordConfig, ToyEncoder, record_file, record_prompt

PROMPTS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now a limerick."]},
    {"question_id": "gsm-2", "category": "math, word problems", "turns": ["What is 2+2?"]},
    {"question_id": 3, "category": "qa", "turns": ["Why is the sky blue?"]},
]


def write_prompts(path, items=PROMPTS):
    path.write_text("".join(json.dumps(p) + "\n" for p in items))
    return str(path)


def toy_record(tmp_path, out="log.npz", temperature=1.0, **kw):
    pair = ToyPair(16, seed=5, closeness=0.9)
    config = RecordConfig(temperature=temperature, max_new_tokens=6,
                          root_top=4, seed=7, **kw, pool=PoolShape(top_k=3, depth=3))
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    path = str(tmp_path / out)
    log = record_file(pair.target, pair.draft, ToyEncoder(16), prompts, path, config,
                      names=("toy-t", "toy-d"), quiet=True)
    return pair, log, path


def test_round_trip_reads_back_identical(tmp_path):
    _, log, path = toy_record(tmp_path)
    back = rowlog.read(path)
    assert back.header == dict(log.header, format=rowlog.FORMAT, version=rowlog.VERSION)
    for name, value in log.arrays().items():
        assert value.dtype == getattr(back, name).dtype, name
        assert np.array_equal(value, getattr(back, name), equal_nan=value.dtype.kind == "f"), name
    assert list(back.seg_question) == ["81", "81", "gsm-2", "3"]
    assert list(back.seg_turn) == [0, 1, 0, 0]
    assert back.header["complete"] and back.header["n_questions"] == 3
    assert not os.path.exists(path + ".parts")


def test_logged_rows_are_the_models_rows(tmp_path):
    pair, log, _ = toy_record(tmp_path)
    assert log.n_records == 4 * 7  # positions 0..5 scored, 6 logged for first_token
    assert np.array_equal(log.rec_scored, np.tile([True] * 6 + [False], 4))
    for r in range(log.n_records):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        ctx = log.prompt(s).tolist() + log.trajectory(s)[:t].tolist()
        tokens, parents, logq, edge = log.pool(r)
        tree, want_logq = pool.expand(pair.draft_row, ctx, 3, 3)
        assert tree == Tree(tokens, parents)
        assert np.allclose(logq, want_logq, atol=1e-6)
        for i in range(1, len(tree)):  # each edge: the target's row at the parent's context
            parent_ctx = ctx + tree.path_tokens(int(parents[i]))
            assert edge[i] == pytest.approx(pair.target_row(parent_ctx)[tokens[i]], rel=1e-6)
        first = tree.children(0)
        root_tokens, root_p = log.root_row(r)
        assert set(tokens[first]) <= set(root_tokens)  # top-4, then first-level tokens
        assert np.all(np.diff(root_p[:4]) <= 0)
        lookup = dict(zip(root_tokens.tolist(), root_p.tolist(), strict=True))
        assert [lookup[x] for x in tokens[first]] == edge[first].astype(np.float32).tolist()
        assert np.allclose(log.stale(r), pair.target_row(ctx[:-1])[tokens[first]], rtol=1e-6)
    # the second turn's prompt holds the first turn's answer
    answer = log.trajectory(0)[:6].tolist()
    second = log.prompt(1).tolist()
    assert second[: len(log.prompt(0))] == log.prompt(0).tolist()
    assert second[len(log.prompt(0)) : len(log.prompt(0)) + 6] == answer


def test_greedy_trajectory_and_one_token_prompt(tmp_path):
    pair = ToyPair(16, seed=2, closeness=0.9)
    config = RecordConfig(temperature=0.0, max_new_tokens=5, stop_ids={99}, pool=PoolShape(top_k=2, depth=2))
    seg = record_prompt(pair.target, pair.draft, [4], config)
    ctx = [4]
    for token in seg["trajectory"]:  # greedy: the argmax of the target's row, 5 + depth tokens
        assert token == int(np.argmax(pair.target_row(ctx)))
        ctx.append(token)
    assert len(seg["trajectory"]) == 7 and not seg["stopped"]
    assert np.isnan(seg["records"][0]["stale_p"]).all()  # no context before a 1-token prompt
    with pytest.raises(ValueError, match="empty"):
        record_prompt(pair.target, pair.draft, [], config)


def test_damaged_logs_raise_naming_the_file(tmp_path):
    _, _, path = toy_record(tmp_path)
    data = open(path, "rb").read()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    corrupted = tmp_path / "corrupted.npz"
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    corrupted.write_bytes(bytes(flipped))
    for bad in (truncated, corrupted):
        with pytest.raises(ValueError, match=str(bad.name)):
            rowlog.read(bad)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.arange(3))
    with pytest.raises(ValueError, match="not a targetrows-rowlog file"):
        rowlog.read(other)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        rowlog.read(tmp_path / "missing.npz")


def test_incomplete_and_inconsistent_logs_are_refused(tmp_path):
    _, log, _ = toy_record(tmp_path)
    part = tmp_path / "part.npz"
    rowlog.write(part, rowlog.RowLog(**dict(vars(log), header=dict(log.header, complete=False))))
    with pytest.raises(ValueError, match="not complete"):
        rowlog.read(part)
    assert rowlog.read(part, require_complete=False).n_records == log.n_records
    broken = dict(vars(log))
    broken["pool_parents"] = log.pool_parents.copy()
    broken["pool_parents"][5] = 40  # a parent after its child
    with pytest.raises(ValueError, match="topological"):
        rowlog.write(tmp_path / "broken.npz", rowlog.RowLog(**broken))
    short = dict(vars(log), edge_p=log.edge_p[:-1])
    with pytest.raises(ValueError, match="edge_p"):
        rowlog.write(tmp_path / "short.npz", rowlog.RowLog(**short))


def test_interrupted_recording_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    _, _, whole = toy_record(tmp_path, out="whole.npz")
    real = record.record_question
    calls = []

    def interrupted(*args):
        calls.append(args[3])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(record, "record_question", interrupted)
    with pytest.raises(KeyboardInterrupt):
        toy_record(tmp_path, out="resumed.npz")
    resumed = str(tmp_path / "resumed.npz")
    assert not os.path.exists(resumed)  # nothing reads as complete
    assert os.listdir(resumed + ".parts") == ["000000.npz"]
    monkeypatch.setattr(record, "record_question", real)
    with pytest.raises(ValueError, match="000000.npz was recorded with seed=7"):
        _record_other_seed(tmp_path)
    toy_record(tmp_path, out="resumed.npz")
    assert open(resumed, "rb").read() == open(whole, "rb").read()


def _record_other_seed(tmp_path):
    pair = ToyPair(16, seed=5, closeness=0.9)
    config = RecordConfig(temperature=1.0, max_new_tokens=6, root_top=4, seed=8,
                          pool=PoolShape(top_k=3, depth=3))
    record_file(pair.target, pair.draft, ToyEncoder(16), str(tmp_path / "prompts.jsonl"),
                str(tmp_path / "resumed.npz"), config, names=("toy-t", "toy-d"), quiet=True)


def test_record_cli_toy_pair_and_bad_input(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[1:])
    out = tmp_path / "log.npz"
    args = ["record", "--target", "toy:16:1", "--draft", "toy:0.9", "--prompts", prompts,
            "--temperature", "1", "--top-k", "3", "--depth", "2", "--stride", "2",
            "--max-new-tokens", "4", "--out", str(out), "--quiet"]
    assert main(args) == 0
    log = rowlog.read(out)
    assert log.header["stride"] == 2 and log.header["vocab_size"] == 16
    assert log.rec_position[log.rec_segment == 0].tolist() == [0, 1, 2, 3]
    assert main(args) == 2 and "exists" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PROMPTS[0]) + "\n{not json\n")
    assert main(args[:6] + [str(bad)] + args[7:] + ["--overwrite"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"question_id": 1, "turns": [""]}) + "\n")
    assert main(args[:6] + [str(empty)] + args[7:] + ["--overwrite"]) == 2
    assert "empty.jsonl:1" in capsys.readouterr().err


def test_several_prompts_files_give_one_row_log_each_as_if_recorded_alone(tmp_path, capsys):
    """One `record` over two prompts files (the pipeline's one job per target x temperature)
    writes the same two row logs, to the byte, as two runs of one file each."""
    a = write_prompts(tmp_path / "a.jsonl", PROMPTS[:1])
    b = write_prompts(tmp_path / "b.jsonl", PROMPTS[1:])
    common = ["record", "--target", "toy:16:1", "--draft", "toy:0.9", "--temperature", "1",
              "--top-k", "3", "--depth", "2", "--max-new-tokens", "4", "--quiet"]
    both = [tmp_path / "a.npz", tmp_path / "b.npz"]
    assert main([*common, "--prompts", a, b, "--out", *map(str, both)]) == 0
    for prompts, out in ((a, both[0]), (b, both[1])):
        alone = tmp_path / f"alone_{out.name}"
        assert main([*common, "--prompts", prompts, "--out", str(alone)]) == 0
        assert alone.read_bytes() == out.read_bytes()
    assert main([*common, "--prompts", a, b, "--out", str(tmp_path / "c.npz")]) == 2
    assert "one row log per prompts file" in capsys.readouterr().err


def test_record_from_tiny_hf_models_round_trips(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import reference_logits, save_tiny_pair
    from transformers import AutoModelForCausalLM

    from targetrows.hf.loading import load_tokenizer

    target_dir, draft_dir = save_tiny_pair(tmp_path, "llama")
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])
    out = tmp_path / "hf.npz"
    assert main(["record", "--target", target_dir, "--draft", draft_dir, "--prompts", prompts,
                 "--top-k", "3", "--depth", "3", "--max-new-tokens", "4", "--out", str(out),
                 "--target-device", "cpu", "--dtype", "float32", "--quiet"]) == 0
    log = rowlog.read(out)
    assert log.n_segments == 2 and log.header["temperature"] == 0.0
    vocab = log.header["vocab_size"]
    assert vocab == len(load_tokenizer(target_dir))
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    for s in range(log.n_segments):  # the trajectory is the target's greedy continuation
        ctx = log.prompt(s).tolist()
        for token in log.trajectory(s).tolist():
            assert token == int(reference_logits(model, ctx)[-1, :vocab].argmax())
            ctx.append(token)
    tokens, parents, _, edge = log.pool(1)  # position 1 of the first turn
    tree = Tree(tokens, parents)
    ctx = log.prompt(0).tolist() + log.trajectory(0)[:1].tolist()
    for i in (1, 4, len(tree) - 1):  # edges at temperature 1 (greedy logs rank with them)
        row = reference_logits(model, ctx + tree.path_tokens(int(parents[i])))[-1, :vocab]
        p = torch.softmax(row.double(), -1)[int(tokens[i])].item()
        assert edge[i] == pytest.approx(p, rel=1e-4, abs=1e-7)


def test_sampled_recording_from_tiny_hf_models_is_deterministic(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import reference_logits, save_tiny_pair
    from transformers import AutoModelForCausalLM

    from targetrows.hf.loading import load_pair
    from targetrows.rowlog.record import ChatEncoder
    from targetrows.specbench.chat import stop_ids

    target_dir, draft_dir = save_tiny_pair(tmp_path, "qwen2")
    target, draft, tokenizer = load_pair(target_dir, draft_dir, "cpu", dtype="float32")
    config = RecordConfig(temperature=1.0, stride=2, max_new_tokens=4,
                          stop_ids=frozenset(stop_ids(tokenizer, target)), pool=PoolShape(top_k=3, depth=2))
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[1:])
    logs = [record_file(target, draft, ChatEncoder(tokenizer), prompts, str(tmp_path / name),
                        config, names=(target_dir, draft_dir), quiet=True)
            for name in ("a.npz", "b.npz")]
    back = rowlog.read(tmp_path / "a.npz")
    for name, value in logs[0].arrays().items():  # in memory == read back
        assert np.array_equal(value, getattr(back, name), equal_nan=value.dtype.kind == "f")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert back.rec_position[back.rec_segment == 0].tolist() == [0, 1, 2, 3]
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    vocab = back.header["vocab_size"]
    for r in (0, 1):  # the stale row: the target's row one token earlier
        ctx = back.prompt(0).tolist() + back.trajectory(0)[:r].tolist()
        tokens, parents, _, edge = back.pool(r)
        first = Tree(tokens, parents).children(0)
        row = torch.softmax(reference_logits(model, ctx[:-1])[-1, :vocab].double(), -1)
        assert np.allclose(back.stale(r), row[tokens[first]].numpy(), rtol=1e-4, atol=1e-7)
        root = torch.softmax(reference_logits(model, ctx)[-1, :vocab].double(), -1)
        assert np.allclose(edge[first], root[tokens[first]].numpy(), rtol=1e-4, atol=1e-7)
