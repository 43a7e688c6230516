"""The root pass beside drafting (`targetrows.decoding.round.root_pass_alongside`): it goes on the
target's side stream, and the target's own stream is ordered after it (`join`, handed the root
row) before the target is used again. A GPU only orders what the round asks it to, so the order
of the asks is what is checked here, on the toy pair, with a stream that records them."""

import pytest
from rerankers import decode_config

from targetrows.core.passes import Pass
from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names, get_decoder


class RecordingStream:
    def __init__(self, events):
        self.events = events
        self.open = False

    def __enter__(self):
        self.events.append(("enter",))
        self.open = True
        return self

    def __exit__(self, *exc):
        self.open = False
        self.events.append(("exit",))
        return False

    def join(self, *handed_over):
        self.events.append(("join", handed_over))


class DeviceClock:
    """A stand-in GPU's clock, which each pass moves on by one millisecond; its timing events
    read it when recorded."""

    def __init__(self):
        self.ms = 0.0

    def event(self):
        return ClockEvent(self.ms)


class ClockEvent:
    def __init__(self, ms):
        self.ms = ms

    def query(self):
        return True

    def elapsed_time(self, end):
        return end.ms - self.ms


class Recorded:
    """A model whose row requests, and a target whose side stream, write to `events`; with a
    `clock`, on a stand-in GPU whose passes it times."""

    def __init__(self, model, events, kind, stream=None, clock=None):
        self._model, self._events, self._kind, self._stream = model, events, kind, stream
        self._clock = clock
        if clock is not None:
            self.device = "gpu:0"
            self.timing_event = clock.event

    def synchronize(self):
        assert self._clock is None, f"{self._kind}: the host waited for the device"

    def __getattr__(self, name):
        return getattr(self._model, name)

    def side_stream(self):
        return self._stream

    def logits_passes(self, context, tree, nodes):
        return (yield Pass(self, (context, tree, nodes)))

    def run_batch(self, items):  # its passes' group: the pass, and the stream it ran on
        out = []
        for context, tree, nodes in items:
            self._tick()
            rows = self._model.logits(context, tree, nodes)
            on_side = self._stream is not None and self._stream.open
            self._events.append((self._kind, len(tree), on_side, rows))
            out.append(rows)
        return out

    def topk_at_passes(self, context, tree, nodes, k):
        self._tick()
        self._events.append((self._kind, len(tree), False, None))
        return (yield from self._model.topk_at_passes(context, tree, nodes, k))

    def _tick(self):
        if self._clock is not None:
            self._clock.ms += 1.0


def _run(decoder, overlap, clock=None, result=False):
    pair = ToyPair(8, seed=1, closeness=0.8, scale=2.0)
    events = []
    stream = RecordingStream(events)
    target = Recorded(pair.target, events, "target", stream, clock)
    draft = Recorded(pair.draft, events, "draft", clock=clock)
    cfg = decode_config(decoder, budget=6, max_new_tokens=24, overlap=overlap,
                        pool=PoolShape(top_k=3, depth=3))
    out = generate(target, draft, [1, 2], cfg)
    return (out if result else out.tokens), events


@pytest.mark.parametrize("decoder", [n for n in decoder_names(learned=False)
                                     if get_decoder(n).root_pass])
def test_the_root_pass_runs_on_the_side_stream_and_is_joined_before_the_target_runs_again(
        decoder):
    tokens, events = _run(decoder, overlap=True)
    assert tokens == _run(decoder, overlap=False)[0]
    side = [i for i, e in enumerate(events) if e[0] == "target" and e[2]]
    assert len(side) > 1, "no root pass went on the side stream"
    for i in side:
        # the root pass, one node, alone on the side stream
        assert events[i][1] == 1 and events[i - 1] == ("enter",) and events[i + 1] == ("exit",)
        # the draft's passes are queued next, beside it; then the target's stream waits for
        # it, handed its row, before the target runs again
        join = next(j for j in range(i, len(events)) if events[j][0] == "join")
        later = [e[0] for e in events[i + 1 : join]]
        assert "draft" in later and "target" not in later
        assert events[join][1] == (events[i][3],)
    # every other target pass runs on the target's own stream
    assert sum(e[2] for e in events if e[0] == "target") == len(side)


def test_one_after_the_other_nothing_goes_on_a_side_stream():
    _, events = _run("fts", overlap=False)
    assert not any(e[0] in ("enter", "exit", "join") for e in events)


def test_the_first_round_prefills_the_prompt_before_anything_drafts():
    """An EAGLE-3 head reads the prompt's target features: they exist before it drafts."""
    for overlap in (False, True):
        _, events = _run("fts", overlap=overlap)
        first_target = next(i for i, e in enumerate(events) if e[0] == "target")
        first_draft = next(i for i, e in enumerate(events) if e[0] == "draft")
        assert first_target < first_draft and events[first_target][1] == 1
        assert not events[first_target][2]  # nothing beside it: no side stream


def test_measure_overlap_times_both_schedules_of_every_root_pass_decoder():
    from targetrows.bench.overlap import measure_overlap, overlap_markdown, root_pass_decoders
    from targetrows.decoding.config import DecodeConfig

    pair = ToyPair(8, seed=1, closeness=0.8, scale=2.0)
    config = DecodeConfig(budget=6, max_new_tokens=12, pool=PoolShape(top_k=3, depth=3))
    rows = measure_overlap(pair.target, pair.draft, [[1, 2], [3]], config)
    names = root_pass_decoders()
    assert "fts" in names and "draft_rank" not in names
    assert [(r["decoder"], r["alongside"]) for r in rows] == [
        (n, a) for n in names for a in (False, True)]
    assert all(r["same_tokens"] and r["t_round"] > 0 for r in rows)
    assert overlap_markdown(rows, "T").count("\n| fts |") == 2


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("decoder", ["draft_rank", "fts", "fts_redraft", "rerank"])
def test_part_times_come_from_device_events_without_a_wait(decoder, overlap):
    """On a GPU a round's part times are read from timing events at the round's end, so the
    host never waits for the device to time it: on a stand-in whose clock moves one
    millisecond a pass, each round's t_root is its root pass, t_draft its draft passes and
    t_drafting both, and nothing calls `synchronize`."""
    result, events = _run(decoder, overlap, clock=DeviceClock(), result=True)
    draft_passes = sum(e[0] == "draft" for e in events)
    ms = 1e-3
    assert sum(r.t_draft for r in result.rounds) == pytest.approx(draft_passes * ms)
    if overlap and get_decoder(decoder).root_pass:  # the first round's, then the side stream's
        root_passes = 1 + sum(e[0] == "target" and e[2] for e in events)
        assert sum(r.t_root for r in result.rounds) == pytest.approx(root_passes * ms)
    for r in result.rounds:
        assert r.t_draft > 0
        assert r.t_drafting == pytest.approx(r.t_draft + r.t_root)
