"""A CPU stand-in for CUDA graphs that fails where a real graph would go wrong.

A CUDA graph records the kernels of one run of a pass with their arguments: the addresses of
the tensors they read and write, and every number. A replay runs those kernels again on
whatever those addresses hold now. So a pass can be captured only if

- it makes the host wait for nothing: an `.item()`, a `nonzero`, a boolean index or a tensor
  made from host data raises while a stream is capturing;
- everything that changes from one pass to the next reaches it through tensors it reads at
  fixed addresses, never through Python values (a length the host keeps, a tensor made anew
  per pass), which the capture freezes: a replay would silently run the first pass's.

Re-running the pass's Python (what a plain stand-in does) checks neither. Here a capture runs
the pass under a dispatch mode that records each operation with its numbers and, for each
tensor the pass did not make itself, its address, and raises on an operation that waits; each
replay runs the pass again, records again, and raises where the record differs from the
capture's. Outputs are written where the capture put them, as a graph writes them.

`replay_in_place(monkeypatch)` makes `BucketGraphs` capture this way (graphs=True on the CPU).
`gpu_branches()` runs the code's GPU branches on the CPU and counts, the same way, the
operations outside captured passes that would make a GPU's host wait. `counting_launches()`
counts the operations a GPU would launch one by one: those outside the captured passes, and
one per replay.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from contextlib import contextmanager, nullcontext

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# operations that make the host wait for the device (their result's value or size is read
# back), or copy host data in: illegal while a CUDA stream is capturing
WAITING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
           aten.is_nonzero.default, aten.equal.default, aten.repeat_interleave.Tensor,
           aten._unique.default, aten._unique2.default, aten.unique_dim.default,
           aten.unique_consecutive.default, aten.lift_fresh.default,
           aten.lift_fresh_copy.default}
BOOLEAN_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


def boolean_indexed(func, args) -> bool:
    """Whether an indexing operation takes a boolean mask as an index (a nonzero inside)."""
    return func in BOOLEAN_INDEXED and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)


class CaptureError(AssertionError):
    """A pass that a CUDA graph could not capture, or would replay wrongly."""


class _Record(TorchDispatchMode):
    """Each operation of one run: its name, its non-tensor arguments, and for each tensor
    argument either the operation of this run that made it or, for a tensor from outside,
    its address, shape, strides and dtype."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self._made: dict[int, tuple[int, int]] = {}  # id(tensor) -> (op, output)
        self._keep: list = []  # outputs stay alive, so their ids are not reused

    def _describe(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in self._made:
            return ("made", *self._made[id(x)])
        return ("outside", x.untyped_storage().data_ptr(), x.storage_offset(),
                tuple(x.shape), tuple(x.stride()), x.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = list(_flat((args, sorted(kwargs.items()))))
        where = f"operation {len(self.ops)} ({func})"
        if func in WAITING:
            raise CaptureError(f"{where} waits for the device or copies host data in: a CUDA "
                               "graph cannot capture it")
        if boolean_indexed(func, args):
            raise CaptureError(f"{where} indexes with a boolean mask (a nonzero: the host "
                               "waits): a CUDA graph cannot capture it")
        self.ops.append((func, tuple(self._describe(x) for x in flat)))
        out = func(*args, **kwargs)
        for i, x in enumerate(_flat(out)):
            if isinstance(x, torch.Tensor):
                self._made[id(x)] = (len(self.ops) - 1, i)
                self._keep.append(x)
        return out


def _flat(x):
    """The leaves of nested tuples and lists (what operations take and return)."""
    if isinstance(x, (tuple, list)):
        for item in x:
            yield from _flat(item)
    else:
        yield x


def _recorded(compute, inputs):
    record = _Record()
    with record:
        out = compute(inputs)
    return out, record.ops


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, x in zip(dst, src, strict=True):
            _copy_into(d, x)
    elif isinstance(dst, dict):
        for key in dst:
            _copy_into(dst[key], src[key])


class ReplayedPass:
    """One captured (stream, bucket): the capture's record and outputs; `replay` re-runs the
    pass, checks it ran what was captured, and writes its outputs over the capture's."""

    inside = 0  # captures and replays running now: their operations are the graph's

    def __init__(self, graphs, inputs):
        self.graphs, self.inputs = graphs, inputs
        ReplayedPass.inside += 1
        try:
            inputs.out, self.ops = _recorded(graphs._compute, inputs)
        finally:
            ReplayedPass.inside -= 1
        self.replays = 0

    def replay(self):
        ReplayedPass.inside += 1  # what a replay runs, its outputs' copies too, is the graph's
        try:
            self._replay()
        finally:
            ReplayedPass.inside -= 1
        _Launches.replayed()

    def _replay(self):
        out, ops = _recorded(self.graphs._compute, self.inputs)
        self.replays += 1
        if ops != self.ops:
            same = (a == b for a, b in zip(ops, self.ops, strict=False))  # up to the shorter
            first = next((i for i, s in enumerate(same) if not s), min(len(ops), len(self.ops)))
            raise CaptureError(
                f"replay {self.replays} differs from its capture at operation {first}: "
                f"captured {self.ops[first] if first < len(self.ops) else 'nothing'}, now "
                f"{ops[first] if first < len(ops) else 'nothing'} (a Python value or a new "
                "tensor reached the pass; a CUDA graph would replay the captured one)")
        _copy_into(self.inputs.out, out)


def _capture(graphs, inputs, stream) -> None:
    """A capture as `BucketGraphs._capture` makes one: a warm-up run first (what a pass makes
    on its first run, a table sized to the cache, is made then, outside the graph)."""
    graphs._compute(inputs)
    inputs.graph = ReplayedPass(graphs, inputs)
    graphs.stats.captured += 1


def replay_in_place(monkeypatch) -> None:
    """Graphs 'captured' as `ReplayedPass`es (graphs=True runs on the CPU)."""
    from targetrows.hf.graphs import BucketGraphs

    monkeypatch.setattr(BucketGraphs, "_capture", _capture)


@contextmanager
def replayed_in_place():
    """`replay_in_place` inside the block (for a script, which has no monkeypatch)."""
    from targetrows.hf.graphs import BucketGraphs

    saved = BucketGraphs._capture
    BucketGraphs._capture = _capture
    try:
        yield
    finally:
        BucketGraphs._capture = saved


class _Waits(TorchDispatchMode):
    """Counts the operations that would make a GPU's host wait, by the innermost line of our
    package that ran them (a NumPy array made a tensor by `torch_rows.pinned` is left out: on
    a GPU that is a pinned, non-blocking copy)."""

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in WAITING or boolean_indexed(func, args):
            ours = [f for f in traceback.extract_stack() if "/targetrows/" in f.filename]
            ours = ours[-1] if ours else None  # None: not our code (a benchmark's own setup)
            if ours is not None and ours.name != "pinned":
                where = ours.filename.split("/targetrows/")[-1]
                self.counts[f"{where}:{ours.lineno} {ours.name}"] += 1
        return func(*args, **(kwargs or {}))


REPLAY = "graph replay"  # `counting_launches`' key for the replays of captured passes
# operations that launch no kernel: views, allocations without a fill, autograd bookkeeping
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "detach", "alias", "lift_fresh", "set_"}


class _Launches(TorchDispatchMode):
    """Counts the operations a GPU launches one by one, by the innermost line of our package
    that ran them: each operation outside a captured pass that runs a kernel (a copy in
    from the host among them), and one per replay (under `REPLAY`)."""

    active: list[Counter] = []

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    @classmethod
    def replayed(cls) -> None:
        for counts in cls.active:
            counts[REPLAY] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not ReplayedPass.inside and name not in _NO_KERNEL and (
                not func.is_view or _copied(args, out)):
            self.counts[_our_line()] += 1
        return out


def _copied(args, out) -> bool:
    """Whether an operation that may return a view of its input (`to`, `reshape`, which
    inference mode hands to a dispatch mode whole) made a copy: an output in new memory."""
    inputs = {x.untyped_storage().data_ptr() for x in _flat(args) if isinstance(x, torch.Tensor)}
    return any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs
               for x in _flat(out))


def _our_line(skip: tuple[str, ...] = ()) -> str:
    """The innermost line of our package on the stack (functions named in `skip` left out),
    as file:line name; "not ours" where there is none."""
    ours = [f for f in traceback.extract_stack()
            if "/targetrows/" in f.filename and f.name not in skip]
    return "not ours" if not ours else (
        f"{ours[-1].filename.split('/targetrows/')[-1]}:{ours[-1].lineno} {ours[-1].name}")


@contextmanager
def counting_launches():
    """Inside the block, counts what a GPU would launch one by one (`_Launches`): yields a
    Counter by line, the replays of captured passes under `REPLAY`, and each copy in from the
    host (`torch_rows.host_to_device`, which on the CPU copies nothing). A CPU count: an
    operation here may be a few kernels there, and a fused one fewer."""
    from targetrows.hf import torch_rows

    counts: Counter = Counter()
    pinned = torch_rows.pinned

    def copied_in(array, device):  # a copy in that the CPU does not make: `host_to_device`'s
        if not ReplayedPass.inside:
            counts[_our_line(skip=("pinned", "copied_in", "host_to_device"))] += 1
        return pinned(array, device)

    _Launches.active.append(counts)
    torch_rows.pinned = copied_in
    try:
        with _Launches(counts):
            yield counts
    finally:
        torch_rows.pinned = pinned
        _Launches.active.remove(counts)


def _sorted_topk(logits, k):
    from targetrows.hf.torch_rows import topk_sorted

    return topk_sorted(torch.log_softmax(logits, dim=-1), k)


class TimingEvent:
    """A CUDA timing event's stand-in: it marks the host clock when recorded and is always
    complete (on the CPU the work it follows has run)."""

    def __init__(self):
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: TimingEvent) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch's


@contextmanager
def gpu_branches(count_waits: bool = True):
    """Inside the block the torch backends take their GPU branches on the CPU (checks queued
    for the next read, each top-k from one sort, pools drafted to full depth, part times from
    timing events); yields a Counter of the other host waits a GPU would have, by our line
    that made them (a model's `synchronize` among them). `count_waits` False: the operations
    are not counted (their dispatch mode costs host time, which a timing should not see)."""
    from targetrows.hf import device_rounds, eagle3, torch_rows

    waits: Counter = Counter()

    def synchronize(self):
        ours = [f for f in traceback.extract_stack() if "/targetrows/" in f.filename][-1]
        waits[f"{ours.filename.split('/targetrows/')[-1]}:{ours.lineno} synchronize"] += 1

    patches = [(torch_rows.TorchRows, "_defer_checks", True),
               (torch_rows, "reads_are_free", lambda device: False),
               (torch_rows.TorchRows, "timing_event", lambda self: TimingEvent()),
               (torch_rows.TorchRows, "synchronize", synchronize)]
    patches += [(module, "ranked", _sorted_topk) for module in (torch_rows, device_rounds, eagle3)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        with _Waits(waits) if count_waits else nullcontext():
            yield waits
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        torch_rows._QUEUED.clear()  # a read a failed block left queued reaches no later test
