"""The CUDA stream code, checked where it can fail: through a stream module that records what it
is asked (`targetrows.hf.streams.device_module`). A GPU orders only what it is asked to, so the
asks are the behaviour: the side stream waits for the caller's work before the root pass, the
caller's stream waits for the root pass's event before it reads its rows (every sequence of a
batch, with its own rows), and before the next pass on the main stream touches the cache."""

import pytest

from targetrows.core.tree import Tree
from targetrows.hf import streams
from targetrows.hf.model import HFModel
from targetrows.hf.streams import SideStream


class Event:
    def __init__(self, stream, n):
        self.name = f"{stream.name}#{n}"


class Stream:
    def __init__(self, log, name):
        self.log, self.name, self.events = log, name, 0

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def record_event(self):
        self.events += 1
        event = Event(self, self.events)
        self.log.append(("record_event", self.name, event.name))
        return event

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event.name))


class Module:
    """torch.cuda's stream functions, recorded: streams by name, the current one per thread."""

    def __init__(self):
        self.log = []
        self.main = Stream(self.log, "main")
        self.current = self.main
        self.made = 0

    def Stream(self, *args):  # noqa: N802 (torch's name)
        self.made += 1
        return Stream(self.log, f"side{self.made}")

    def current_stream(self, device=None):
        return self.current

    def stream(self, s):
        module = self

        class Context:
            def __enter__(self):
                self.before, module.current = module.current, s
                module.log.append(("enter", s.name))

            def __exit__(self, *exc):
                module.current = self.before
                module.log.append(("exit", s.name))
                return False

        return Context()


@pytest.fixture
def module(monkeypatch):
    recorded = Module()
    monkeypatch.setattr(streams, "device_module", lambda device: recorded)
    return recorded


def test_the_side_stream_waits_for_the_caller_and_the_caller_for_its_event(module):
    side = SideStream("cpu")
    with side:
        module.log.append(("work", module.current.name))
    module.log.append(("drafting", module.current.name))
    side.join()
    assert module.log == [
        ("wait_stream", "side1", "main"),  # the root pass sees the cache as committed
        ("enter", "side1"), ("work", "side1"), ("exit", "side1"),
        ("record_event", "side1", "side1#1"),
        ("drafting", "main"),  # the caller's own work is not held up
        ("wait_event", "main", "side1#1"),  # until it uses what the root pass made
        ("enter", "main"), ("exit", "main"),
    ]
    side.join()  # a second join (another sequence's rows) waits for the same work
    assert module.log[-3:] == [("wait_event", "main", "side1#1"), ("enter", "main"),
                               ("exit", "main")]


def _recorded_passes(module, monkeypatch):
    """Each pass a model runs goes into the module's log as ("pass", its model, stream)."""
    from targetrows.hf.lanes import Lanes

    run_batch = Lanes.run_batch

    def recorded(passes, feeds):
        module.log.append(("pass", passes.name, module.current.name))
        return run_batch(passes, feeds)

    monkeypatch.setattr(Lanes, "run_batch", recorded)


def test_every_sequence_of_a_batch_joins_with_its_root_rows(module, monkeypatch):
    """Overlapped decoding at batch 2 (the root pass on the target's side stream): after each
    side pass, each sequence's join waits for the side stream's event before the target's
    next pass on the main stream, once per sequence (each with its own rows)."""
    from test_batch import HF_PROMPTS, _configs
    from tiny_models import tiny_model

    from targetrows.core.pool import PoolShape
    from targetrows.decoding.batch import generate_batch

    _recorded_passes(module, monkeypatch)
    target = HFModel(tiny_model("llama", n_layers=2), name="t")
    draft = HFModel(tiny_model("llama", seed=1, n_layers=1), name="d")
    configs = _configs("fts", 2, pool=PoolShape(top_k=3, depth=2), overlap=True)
    generate_batch(target, draft, HF_PROMPTS[:2], configs, 2)
    log = module.log
    sides = [i for i, e in enumerate(log) if e[:2] == ("pass", "t") and e[2] != "main"]
    assert len(sides) >= 3
    for i in sides:
        after = next(j for j in range(i + 1, len(log)) if log[j][:3] == ("pass", "t", "main"))
        window = log[i:after]
        recorded = [e[2] for e in window if e[:2] == ("record_event", "side1")]
        waits = [e[2] for e in window if e[:2] == ("wait_event", "main")]
        # both sequences joined, for the side stream's last work, before the target's pass
        assert len(waits) >= 2 and set(waits) == {recorded[-1]}, window


def test_the_next_main_pass_waits_for_a_side_pass_no_sequence_joined(module, monkeypatch):
    """A root pass queued on the side stream whose sequence has not joined yet (it drafts)
    while another sequence's pass on the main stream comes next: the scheduler makes the main
    stream wait for the side stream first."""
    from tiny_models import tiny_model

    from targetrows.decoding.round import on_side_stream
    from targetrows.decoding.schedule import run_batched

    _recorded_passes(module, monkeypatch)
    target = HFModel(tiny_model("llama", n_layers=2), name="t")

    def beside(t, d):  # a root pass on the side stream, never joined here
        _, rows = yield from on_side_stream(t, t.logits_passes([5, 6], Tree.root_only(6), [0]))
        return rows

    def main(t, d):
        return (yield from t.logits_passes([7, 8, 9], Tree.root_only(9), [0]))

    run_batched(target, None, [beside, main], 2)
    log = module.log
    side, main_pass = log.index(("pass", "t", "side1")), log.index(("pass", "t", "main"))
    assert side < main_pass
    last = [e[2] for e in log[side:main_pass] if e[:2] == ("record_event", "side1")][-1]
    assert ("wait_event", "main", last) in log[side:main_pass]  # all the side's work
