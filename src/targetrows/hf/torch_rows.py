"""Reading rows that are torch logits (draws, top-k, log-probs), shared by every torch backend,
with as few waits for the GPU as the answers allow.

A CUDA backend queues kernels and returns at once; the host waits only where it needs a value
back. Each wait drains the queue, so the GPU idles while Python prepares the next launch, and in
a round of a few small passes the waits can set the pace (`targetrows.bench.syncs` counts them;
the first GPU check found 30-100 per round). So here:

- numbers go to the GPU through pinned memory without waiting (`host_to_device`);
- whatever a read needs back comes in one device-to-host copy (`TorchRows._fetch`): the draws,
  top-k ids and log-probs together;
- on a GPU the check that a pass's rows are finite (a model that overflows in its dtype gives
  NaN) is queued with the pass and read back with the next fetch, not waited for in the pass;
- top-k on a GPU ranks by one stable sort (ties to the lower id with no data-dependent branch);
  on a CPU, where nothing waits, by `torch.topk` and a tie check;
- a read that can wait is queued (`TorchRows._read_later`) and comes with the next fetch on
  its device, whichever model makes it: a draft's pool with the target's draw of t0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from targetrows.core.checks import check_temperature
from targetrows.core.passes import Passes, run_now
from targetrows.core.rows import greedy, ranking_temperature
from targetrows.core.tree import Tree

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_,
          torch.float64: np.float64, torch.float32: np.float32}


def reads_are_free(device: torch.device) -> bool:
    """Whether reading a value back waits for nothing (the CPU): then a pool may stop early,
    and a read is not queued for later."""
    return torch.device(device).type == "cpu"


class QueuedRead:
    """A read queued for the next fetch on its device (`TorchRows._read_later`): `tensors`,
    and `use(arrays)` taking them. Calling it makes sure the read is done, fetching then if
    none has come."""

    def __init__(self, owner, device: torch.device, tensors, use):
        self.owner, self.device, self.tensors, self.use = owner, device, tensors, use
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            self.owner._fetch(device=self.device)


def _in_one_copy(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """`tensors` (on one device) as NumPy arrays of their own dtypes, in one copy to the
    host: their bytes in one buffer, widest elements first so that each array starts
    aligned. A read of a pool's two dozen tensors is two launches (the gather, the copy),
    not a conversion to one dtype each."""
    if not tensors:
        return []
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())  # stable
    parts = [tensors[i].reshape(-1).contiguous().view(torch.uint8) for i in order]
    host = torch.cat(parts).cpu().numpy()  # new memory, also on the CPU: nothing aliases
    out: list[np.ndarray | None] = [None] * len(tensors)
    at = 0
    for i in order:
        t = tensors[i]
        n = t.numel() * t.element_size()
        out[i] = host[at:at + n].view(_NUMPY[t.dtype]).reshape(tuple(t.shape))
        at += n
    return out


# reads queued per device, for whichever model fetches there next
_QUEUED: dict[torch.device, list[QueuedRead]] = {}


def _key(device: torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A NumPy array as a tensor on `device`, copied there without waiting (`pinned`)."""
    return pinned(array, device).to(device, non_blocking=True)


def pinned(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A NumPy array as a host tensor to copy to `device` without waiting: in pinned memory
    for a GPU, since a copy from pageable memory blocks the host until everything queued
    before it has run (torch's pinned-memory cache keeps the block until the copy is done)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.pin_memory() if torch.device(device).type == "cuda" else tensor


def on_device(values, device: torch.device) -> torch.Tensor:
    """`values` on `device`: a NumPy array copied there (`host_to_device`), a tensor moved if
    it is elsewhere (a step's inputs come from the host, or from a pool grown on the device)."""
    if isinstance(values, torch.Tensor):
        return values.to(device)
    return host_to_device(values, device)


class TorchRows:
    """Reading rows that are torch logits: shared by every torch backend. Needs `name`,
    `device` and a seeded `_generator` on the rows' device; `reset` calls `_new_sequence`."""

    name: str
    device: torch.device
    _generator: torch.Generator
    # checks queued with passes, read back with the next fetch: (flags per row on the device,
    # a function of the flags on the host -> an error message or None)
    _pending: list[tuple[torch.Tensor, Callable[[np.ndarray], str | None]]]

    def _request(self, context, tree: Tree, nodes) -> tuple[np.ndarray, np.ndarray]:
        """`logits`' arguments as arrays, checked: a non-empty context whose last token is the
        tree's root, and nodes inside the tree."""
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
        if len(ctx) == 0:
            raise ValueError(f"{self.name}: the context is empty; the root needs one token")
        if int(tree.tokens[0]) != int(ctx[-1]):
            raise ValueError(
                f"{self.name}: tree root token {int(tree.tokens[0])} is not the last context "
                f"token {int(ctx[-1])}"
            )
        if len(nodes) and (nodes.min() < 0 or nodes.max() >= len(tree)):
            raise ValueError(f"{self.name}: nodes {nodes.tolist()} outside a {len(tree)}-node tree")
        return ctx, nodes

    def synchronize(self) -> None:
        """Wait for the work this thread queued on this model's GPU (timers read after it
        measure it): its current stream only, so a root pass on a stream of its own is not
        waited for by the drafting beside it, nor the drafting by it."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def timing_event(self):
        """A timing event queued on this model's current stream (the host does not wait), or
        None off a GPU, where the host clock times the work (`targetrows.decoding.timing`)."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    # -- checks and transfers ------------------------------------------------------------------
    def _new_sequence(self, seed: int | None) -> None:
        """What every backend's `reset` does besides its cache: no check left pending, and the
        sampling generator reseeded (from `seed`, or afresh)."""
        self._pending = []
        for queued in _QUEUED.values():  # a read left from an abandoned round is not taken
            queued[:] = [q for q in queued if q.owner is not self]
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))

    # queue checks for the next fetch: None queues them on a GPU only (on a CPU a check costs no
    # wait, and a bad row is named at once, before anything computes on it); tests set True
    _defer_checks: bool | None = None

    def _check_later(self, values: torch.Tensor, verdict: Callable[[np.ndarray], str | None]):
        """A check of a pass's rows: `values` (one per row, on the device) go to the host with
        the next fetch, and `verdict(values)` there names the problem, if any, which is then
        raised. On a CPU it runs at once (unless `_defer_checks`)."""
        defer = self._defer_checks
        if defer is None:
            defer = values.device.type != "cpu"
        self._pending.append((values, verdict))
        if not defer:
            self._fetch()

    def _read_later(self, tensors: list[torch.Tensor],
                    use: Callable[[list[np.ndarray]], None]) -> Callable[[], None]:
        """Read `tensors` with the next fetch on their device, this model's or another's (a
        target's draw of t0 brings a draft's pool with it: one wait for both), and hand the
        arrays to `use`. Returns a function that makes sure that has happened, fetching then
        if no read came. Where reads are free (the CPU) they are read at once."""
        device = _key(tensors[0].device)
        if reads_are_free(device):
            use(self._fetch(*tensors))
            return _read
        entry = QueuedRead(self, device, tensors, use)
        _QUEUED.setdefault(device, []).append(entry)
        return entry

    def _check_finite(self, rows: torch.Tensor, positions, at=None) -> None:
        """Queue the check that `rows` are finite: read back with the next draw, top-k or
        log-probs (no wait here); a NaN/inf row then names its sequence position, `positions`
        (an array, or a tensor read only then) at the rows' places `at` (all by default)."""
        # one launch a pass: a row's sum in float64 is finite exactly when its entries are
        # (a vocabulary of float32 entries sums to far below float64's range), and over
        # vocabulary-wide rows it costs a fraction of an elementwise isfinite. Nothing reads
        # the rows later, which a graph's next replay of the same bucket may have overwritten.
        sums = rows.sum(dim=-1, dtype=torch.float64)

        def verdict(row_sums: np.ndarray) -> str | None:
            finite = np.isfinite(row_sums)
            if finite.all():
                return None
            where = np.asarray(positions.cpu() if isinstance(positions, torch.Tensor)
                               else positions)
            where = where if at is None else where[at]
            return (f"{self.name}: the logits after sequence position(s) "
                    f"{where[~finite].tolist()} (0-based, prompt included) contain NaN or "
                    f"inf; the model overflows in {self.dtype}: try --dtype float32")

        self._check_later(sums, verdict)

    def _fetch(self, *tensors: torch.Tensor, device: torch.device | None = None
               ) -> list[np.ndarray]:
        """`tensors` as NumPy arrays in one device-to-host copy (one wait, not one per tensor),
        with the reads queued on their device (`device` without tensors; this model's by
        default) and the checks queued since the last fetch; raises ValueError if one fails."""
        pending, self._pending = self._pending, []
        where = _key(tensors[0].device if tensors else device or self.device)
        queued = _QUEUED.pop(where, [])
        reads = [*tensors, *(t for q in queued for t in q.tensors)]
        checks = [values.to(where) for values, _ in pending]
        out = _in_one_copy([*reads, *checks])
        for (_, verdict), values in zip(pending, out[len(reads):], strict=True):
            problem = verdict(values.reshape(-1))
            if problem:
                raise ValueError(problem)
        at = len(tensors)
        for q in queued:
            q.done = True
            q.use(out[at:at + len(q.tensors)])
            at += len(q.tensors)
        return out[:len(tensors)]

    # -- reading rows --------------------------------------------------------------------------
    @staticmethod
    def _work(logits: torch.Tensor) -> torch.Tensor:
        """Rows in at least float32 (bf16 rows lose too much in softmax)."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            return logits.float()
        return logits

    @torch.inference_mode()
    def draw(self, logits: torch.Tensor | tuple[torch.Tensor, ...],
             temperature: float) -> np.ndarray:
        if isinstance(logits, tuple):  # blocks drawn in one read (rows in order: one stream)
            logits = torch.cat(logits)
        if greedy(temperature):
            return self._fetch(logits.argmax(dim=-1))[0]  # first maximum: ties to the lower id
        check_temperature(temperature, f"{self.name}: temperature")
        probs = torch.softmax(self._work(logits) / temperature, dim=-1)
        picks = torch.multinomial(probs, 1, generator=self._generator)
        return self._fetch(picks[:, 0])[0]

    @torch.inference_mode()
    def topk(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best tokens of each row, by log-prob with ties to the lower id (the order
        `pool.topk_tokens` uses), so a pool never depends on how torch.topk breaks ties."""
        ids, vals = self._fetch(*ranked(self._work(logits), k))
        return ids, vals.astype(np.float64)

    def logits(self, context, tree: Tree, nodes) -> torch.Tensor:
        return run_now(self.logits_passes(context, tree, nodes))

    def topk_at(self, context, tree: Tree, nodes, k: int) -> tuple[np.ndarray, np.ndarray]:
        return run_now(self.topk_at_passes(context, tree, nodes, k))

    def topk_at_passes(self, context, tree: Tree, nodes,
                       k: int) -> Passes[tuple[np.ndarray, np.ndarray]]:
        return self.topk((yield from self.logits_passes(context, tree, nodes)), k)

    @torch.inference_mode()
    def logprobs(self, logits: torch.Tensor | tuple[torch.Tensor, ...], tokens: np.ndarray,
                 temperature: float) -> np.ndarray:
        tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
        return self._fetch(self.logprobs_on_device(logits, tokens, temperature))[0]

    @torch.inference_mode()
    def logprobs_read_later(self, logits: torch.Tensor | tuple[torch.Tensor, ...],
                            tokens: torch.Tensor,
                            temperature: float) -> Callable[[], np.ndarray]:
        """`logprobs` at `tokens` [1 or rows, m] that are still on the device (a draft's pool,
        not read yet), read with the next read on the rows' device (the pool's, when it is
        there: one wait for both). Returns a function that gives them."""
        got = []
        wait = self._read_later([self.logprobs_on_device(logits, tokens, temperature)], got.extend)

        def value() -> np.ndarray:
            wait()
            return got[0]
        return value

    @torch.inference_mode()
    def logprobs_on_device(self, logits, tokens: np.ndarray | torch.Tensor,
                           temperature: float) -> torch.Tensor:
        """`logprobs` left on the device (float64): of rows `logits` (a tuple of blocks: their
        rows in order) at `tokens` [1 or rows, m]."""
        if isinstance(logits, tuple):
            logits = torch.cat(logits)
        lp = torch.log_softmax(self._work(logits) / ranking_temperature(temperature), dim=-1)
        index = on_device(tokens, lp.device)
        if index.shape[0] != lp.shape[0]:
            index = index.expand(lp.shape[0], -1)
        return lp.gather(-1, index).double()

    @torch.inference_mode()
    def probs(self, logits: torch.Tensor, temperature: float) -> np.ndarray:
        if greedy(temperature):
            out = np.zeros(tuple(logits.shape), dtype=np.float64)
            out[np.arange(out.shape[0]), self._fetch(logits.argmax(dim=-1))[0]] = 1.0
            return out
        return self._fetch(torch.softmax(logits.double() / temperature, dim=-1))[0]


def _read() -> None:
    """A read already done: nothing to wait for."""


# rows ranked together on a CPU: 16 rows of a 50k vocabulary in float32 are 3 MB
CPU_TOPK_ROWS = 16


def ranked(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs at temperature 1) of each row's k best, best first, ties to the lower
    id, left on the device: on a GPU from one sort (no host read); on a CPU, where a read costs
    nothing and a full sort much, from torch.topk with a tie check, a few rows at a time (each
    part's log-probs stay in the cache: 3x faster)."""
    k = min(int(k), logits.shape[-1])
    if logits.device.type == "cuda":
        return topk_sorted(torch.log_softmax(logits, dim=-1), k)
    parts = [topk_tie_checked(torch.log_softmax(part, dim=-1), k)
             for part in logits.split(CPU_TOPK_ROWS)]
    ids, vals = (torch.cat(t) for t in zip(*parts, strict=True))
    return ids, vals


def topk_tie_checked(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs) of each row's k best, best first, ties to the lower id: torch.topk of
    k + 1, then a check for a tie at the k-th value (one host read, free on a CPU): with the
    (k+1)-th value below the k-th, exactly k values reach the k-th, so the set is right."""
    n = lp.shape[-1]
    vals, ids = torch.topk(lp, min(k + 1, n), dim=-1)
    if k == n or bool((vals[:, k] < vals[:, k - 1]).all()):
        # the usual case, no tie at the k-th value: the set is right, fix the order
        vals, ids = vals[:, :k], ids[:, :k]
        ids, by_id = ids.sort(dim=-1)
        vals = vals.gather(-1, by_id)
    else:
        # take everything above the k-th value, then the lowest ids among those equal to it
        kth = vals[:, k - 1 : k]
        above, equal = lp > kth, lp == kth
        short = k - above.sum(dim=-1, keepdim=True)
        chosen = above | (equal & (equal.cumsum(dim=-1) <= short))
        ids = chosen.nonzero()[:, 1].view(lp.shape[0], k)  # row-major: ascending ids
        vals = lp.gather(-1, ids)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), vals


def topk_sorted(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same ranking from one stable descending sort of each row (equal values keep their
    id order): no host read, so a GPU never waits; a full sort, which a CPU pays for."""
    vals, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    return ids[:, :k], vals[:, :k]
