"""Library passages: what is read and left out, seeded and spread, and the replies that use
them (labelled from the chat header on, after the template and sampled replies)."""

from __future__ import annotations

import pytest

from targetrows.train.library_text import library_files, library_passages


def _function(name: str, lines: int) -> str:
    body = "".join(f"    x{i} = {i}  # step {i} of {name}\n" for i in range(lines))
    return f"def {name}():\n    \"\"\"Docstring of {name}.\"\"\"\n{body}"


@pytest.fixture
def library(tmp_path):
    """A small library: three modules of five functions, one broken file, and sources that must
    be left out (tests, installed packages)."""
    for mod in ("alpha", "beta", "gamma"):
        (tmp_path / f"{mod}.py").write_text("\n".join(_function(f"{mod}_{i}", 8) for i in range(5)))
    (tmp_path / "short.py").write_text("def tiny():\n    return 1\n")
    (tmp_path / "broken.py").write_text("def broken(:\n")
    for skipped in ("test", "site-packages/pkg"):
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "left_out.py").write_text(_function("left_out", 8))
    return tmp_path


def test_tests_and_installed_packages_are_left_out(library):
    names = [f.name for f in library_files(library)]
    assert names == ["alpha.py", "beta.py", "broken.py", "gamma.py", "short.py"]
    passages = library_passages(100, root=library, per_file=10)
    assert len(passages) == 15  # every long enough function, none from the skipped folders
    assert not any("left_out" in p or "tiny" in p for p in passages)


def test_passages_are_seeded_distinct_cut_and_spread(library):
    first = library_passages(6, seed=3, per_file=2, max_chars=120, root=library)
    assert first == library_passages(6, seed=3, per_file=2, max_chars=120, root=library)
    assert first != library_passages(6, seed=4, per_file=2, max_chars=120, root=library)
    assert len(first) == len(set(first)) == 6
    assert all(p.startswith("def ") and len(p) <= 120 for p in first)
    modules = [p.split()[1].split("_")[0] for p in first]
    assert sorted(modules.count(m) for m in set(modules)) == [2, 2, 2]  # two from each file


def test_an_empty_library_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Python sources"):
        library_passages(3, root=tmp_path)


def test_the_installed_library_gives_passages():
    passages = library_passages(20, seed=0)
    assert len(passages) == 20 and len(set(passages)) == 20
    assert all(p.lstrip().startswith(("def ", "class ", "async def ", "@")) for p in passages)


def test_replies_label_library_passages_from_the_chat_header():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import tiny_model, tiny_tokenizer

    from targetrows.specbench.chat import encode_prompt
    from targetrows.train.replies import RepliesConfig, generate_replies, shared_prefix

    model, tok = tiny_model(n_layers=2), tiny_tokenizer()
    config = RepliesConfig(prompts=3, self_prompts=0, sampled=0, heldout=1, max_new_tokens=4,
                           gen_batch=8, top_k=4, features=False, library_passages=2,
                           library_reply_tokens=3)
    train, _, summary = generate_replies(model, tok, config)
    assert len(train.sequences) == 5 and summary["library_prompts"] == 2
    asked = [encode_prompt(tok, p) for p in library_passages(2, seed=0)]
    for seq, ids in zip(train.sequences[3:], asked, strict=True):
        assert seq[: len(ids)] == ids and 1 <= len(seq) - len(ids) <= 3
    # the passages' text is labelled from the prefix they share on (the chat header and
    # whatever both start with), whatever --replies-only says of the other prompts
    assert train.prompt_lens[3:] == [shared_prefix(asked)] * 2
    assert shared_prefix(asked) < min(map(len, asked))
    assert len(train.hidden) == sum(len(s) - p for s, p in zip(train.sequences,
                                                                train.prompt_lens, strict=True))


def test_passages_follow_the_parser_across_form_feeds(tmp_path):
    """A form feed is no line end to the parser: the passage is still the whole function."""
    (tmp_path / "paged.py").write_text("X = 1\n\x0c\n" + _function("paged", 8))
    passage, = library_passages(1, root=tmp_path)
    assert passage == _function("paged", 8).strip("\n")
