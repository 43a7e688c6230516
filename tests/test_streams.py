"""The CUDA stream code, checked where it can fail: through a stream module that records what it
is asked (`targetrows.hf.streams.device_module`). A GPU orders only what it is asked to, so the
asks are the behaviour: the side stream waits for the caller's work before the root pass, the
caller's stream waits for the root pass's event before it reads its rows, and a feature buffer
that grew during the root pass is read only after its copy."""

import numpy as np
import pytest
import torch

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
    side.join()  # a second join has nothing to wait for
    assert module.log[-1] == ("exit", "main")


def test_features_grown_beside_a_read_are_read_after_their_copy(module):
    from tiny_models import tiny_model

    model = HFModel(tiny_model("llama", n_layers=2), name="t", feature_layers=[0, 1])
    context = np.random.default_rng(0).integers(3, 200, size=260).tolist()
    model.logits(context[:100], Tree.root_only(context[99]), [0])  # 100 rows, room for 256
    model.commit(context[:100])
    before = model.features(context[:100], 0, 100)
    assert not [e for e in module.log if e[0] == "wait_event"]  # nothing grew yet
    with SideStream("cpu"):  # a root pass that feeds 160 more: the buffer grows, on the side
        model.logits(context, Tree.root_only(context[-1]), [0])
    growth, _ = [e[2] for e in module.log if e[:2] == ("record_event", "side1")]  # copy, exit
    module.log.clear()
    rows = model.features(context[:100], 0, 100)  # the head drafting meanwhile, lock-free
    assert module.log == [("wait_event", "main", growth)]  # for the rows' copy
    assert torch.equal(rows, before)
