"""Row logs: the target's rows recorded once on its own trajectory, read back with NumPy alone.

Format ``targetrows-rowlog``, version 1. A log is one uncompressed ``.npz`` file (a zip of
``.npy`` arrays, laid out as ``numpy.savez`` does but with fixed member time stamps, so the same
rows give the same bytes; every member carries a CRC-32 that is checked on read). Nothing in it
needs pickle. ``header`` is a uint8 array of UTF-8 JSON:

    format "targetrows-rowlog", version 1, complete (true only for a finished log; per-prompt
    part files written while recording say false and name their ``part``), target, draft,
    draft_kind (eagle3 or standalone; absent from logs recorded before it was kept),
    prompts (the prompts file) and prompts_sha256, n_questions (prompts in that file),
    temperature, top_k, depth, stride, max_new_tokens, root_top, path_top_k, seed, vocab_size,
    stop_ids.

A *segment* is one prompt turn (MT-bench questions have two); a *record* is one position of a
segment's trajectory where the draft's candidate pool was logged. Flat arrays with offsets
(``X_offsets`` has one entry more than there are owners; owner i holds ``X[off[i]:off[i+1]]``):

    per segment  seg_question (str, the question_id), seg_task (str, the category), seg_turn,
                 seg_stopped (the trajectory ended on a stop token, which it keeps);
                 prompt_tokens / prompt_offsets (the encoded prompt of the turn);
                 traj_tokens / traj_offsets (the target's own continuation: greedy at
                 temperature 0, sampled otherwise; max_new_tokens + depth tokens unless stopped,
                 so that every scored position has a full greedy continuation).
    per record   rec_segment, rec_position t (the pool is at context prompt + traj[:t]),
                 rec_scored (t is a multiple of stride; the other records sit at t + 1 for
                 first_token_redraft); pool_offsets, first_offsets (into stale_p), root_offsets.
                 Records are sorted by (segment, position).
    per node     pool_tokens (int32), pool_parents (int16; -1 at each pool's root, local
                 indices), pool_logq (float32, cumulative draft log-prob, 0 at the root),
                 edge_p (float32, the target's probability of the node's token at its parent's
                 context, 1 at the root). Pools are in `targetrows.core.pool` order (level by level).
    per first-level node (in pool order)  stale_p: the probability of the token under the
                 target's row at the previous context prompt + traj[:t-1] (NaN when there is
                 none: a one-token prompt at t = 0).
    per root-row entry  root_tokens / root_p: the target's row at the record's context, kept
                 sparse: its root_top most likely tokens, then any first-level pool token not
                 among them.
    per prompt token  prompt_topk (int32 [prompt tokens, path_top_k]): the target's top ids,
                 best first, at prompt[:i + 1] (RACER's first table writes).
    per trajectory token  traj_topk (int32 [trajectory tokens, path_top_k]): the target's top
                 ids at prompt + traj[:t], the row traj[t] was drawn from (what a draft-free
                 decoder's table learns along the accepted path: `targetrows.rowlog.draft_free`).
                 Both optional: a log recorded without them holds [0, 0] arrays.

Probabilities are at the recording temperature; at temperature 0 they are at temperature 1
(rows rank candidates; greedy acceptance is read off the trajectory instead).

Reading it without targetrows::

    z = numpy.load(path)  # no allow_pickle needed
    header = json.loads(z["header"].tobytes())
    off = z["pool_offsets"]
    parents_of_record_7 = z["pool_parents"][off[7] : off[8]]
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field, fields

import numpy as np

from targetrows.core.atomic import atomic_file
from targetrows.core.checks import check_format

FORMAT = "targetrows-rowlog"
VERSION = 1

# name -> dtype; offsets arrays are int64
_ARRAYS = {
    "seg_question": "U", "seg_task": "U", "seg_turn": np.int32, "seg_stopped": np.bool_,
    "prompt_tokens": np.int32, "prompt_offsets": np.int64,
    "traj_tokens": np.int32, "traj_offsets": np.int64,
    "rec_segment": np.int32, "rec_position": np.int32, "rec_scored": np.bool_,
    "pool_offsets": np.int64, "first_offsets": np.int64, "root_offsets": np.int64,
    "pool_tokens": np.int32, "pool_parents": np.int16, "pool_logq": np.float32,
    "edge_p": np.float32, "stale_p": np.float32, "root_tokens": np.int32, "root_p": np.float32,
    "prompt_topk": np.int32, "traj_topk": np.int32,
}
# [tokens, path_top_k] rows along the path, empty ([0, 0]) in a log recorded without them
_TOPK = {"prompt_topk": "prompt_tokens", "traj_topk": "traj_tokens"}  # -> the tokens they follow
_OFFSETS = {  # offsets -> (flat arrays it indexes, owner count array)
    "prompt_offsets": (("prompt_tokens",), "seg_turn"),
    "traj_offsets": (("traj_tokens",), "seg_turn"),
    "pool_offsets": (("pool_tokens", "pool_parents", "pool_logq", "edge_p"), "rec_segment"),
    "first_offsets": (("stale_p",), "rec_segment"),
    "root_offsets": (("root_tokens", "root_p"), "rec_segment"),
}
# header keys a resumed recording must share with its part files (the prompts file is known by
# its content: the same file under another relative path still resumes)
SETTINGS = ("target", "draft", "prompts_sha256", "n_questions", "temperature", "top_k", "depth",
            "stride", "max_new_tokens", "root_top", "path_top_k", "seed", "vocab_size",
            "stop_ids")


@dataclass
class RowLog:
    """A row log in memory: the header dict and the arrays described in the module docstring."""

    header: dict
    seg_question: np.ndarray
    seg_task: np.ndarray
    seg_turn: np.ndarray
    seg_stopped: np.ndarray
    prompt_tokens: np.ndarray
    prompt_offsets: np.ndarray
    traj_tokens: np.ndarray
    traj_offsets: np.ndarray
    rec_segment: np.ndarray
    rec_position: np.ndarray
    rec_scored: np.ndarray
    pool_offsets: np.ndarray
    first_offsets: np.ndarray
    root_offsets: np.ndarray
    pool_tokens: np.ndarray
    pool_parents: np.ndarray
    pool_logq: np.ndarray
    edge_p: np.ndarray
    stale_p: np.ndarray
    root_tokens: np.ndarray
    root_p: np.ndarray
    prompt_topk: np.ndarray = field(default_factory=lambda: _no_topk())
    traj_topk: np.ndarray = field(default_factory=lambda: _no_topk())

    @property
    def n_segments(self) -> int:
        return len(self.seg_turn)

    @property
    def n_records(self) -> int:
        return len(self.rec_segment)

    @property
    def has_path_rows(self) -> bool:
        """Whether the target's top ids along each prompt and trajectory were recorded."""
        return self.traj_topk.shape[1] > 0 and self.prompt_topk.shape[1] > 0

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "header"}

    def trajectory(self, segment: int) -> np.ndarray:
        return self.traj_tokens[self.traj_offsets[segment] : self.traj_offsets[segment + 1]]

    def prompt(self, segment: int) -> np.ndarray:
        return self.prompt_tokens[self.prompt_offsets[segment] : self.prompt_offsets[segment + 1]]

    def pool(self, record: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, parents, logq, edge_p) of one record's pool, as int64 / float64."""
        s = slice(self.pool_offsets[record], self.pool_offsets[record + 1])
        return (self.pool_tokens[s].astype(np.int64), self.pool_parents[s].astype(np.int64),
                self.pool_logq[s].astype(np.float64), self.edge_p[s].astype(np.float64))

    def stale(self, record: int) -> np.ndarray:
        return self.stale_p[self.first_offsets[record] : self.first_offsets[record + 1]]

    def root_row(self, record: int) -> tuple[np.ndarray, np.ndarray]:
        s = slice(self.root_offsets[record], self.root_offsets[record + 1])
        return self.root_tokens[s], self.root_p[s]

    def record_index(self, segment: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Record index of each (segment, position), -1 where none was logged."""
        key = self.rec_segment.astype(np.int64) << 32 | self.rec_position.astype(np.int64)
        want = np.asarray(segment, np.int64) << 32 | np.asarray(position, np.int64)
        if len(key) == 0:
            return np.full(want.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(key, want), len(key) - 1)
        return np.where(key[at] == want, at, -1)


def _no_topk() -> np.ndarray:
    return np.zeros((0, 0), dtype=np.int32)


def _topk(segments: list[dict], key: str) -> np.ndarray:
    """[tokens, k] rows of every segment, or [0, 0] when a segment has none."""
    chunks = [s.get(key) for s in segments]
    if not chunks or any(c is None for c in chunks):
        return _no_topk()
    return np.concatenate([np.asarray(c, dtype=np.int32).reshape(len(c), -1) for c in chunks])


def _flat(chunks, dtype) -> np.ndarray:
    chunks = [np.asarray(c, dtype=dtype).reshape(-1) for c in chunks]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)


def _offsets(chunks) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype(np.int64)


def from_segments(header: dict, segments: list[dict]) -> RowLog:
    """A RowLog from per-segment dicts (what `targetrows.rowlog.record` builds): keys question, task,
    turn, stopped, prompt, trajectory and records, a list of dicts with position, scored,
    tokens, parents, logq, edge_p, stale_p, root_tokens, root_p; optionally prompt_topk and
    traj_topk (in every segment, else in none)."""
    recs = [(i, r) for i, s in enumerate(segments) for r in s["records"]]
    biggest = max((len(r["tokens"]) for _, r in recs), default=0)
    if biggest > np.iinfo(np.int16).max:
        raise ValueError(f"a pool of {biggest} nodes is too large for the row log (int16 "
                         "parents): use a smaller top_k or depth")
    col = lambda key: [r[key] for _, r in recs]  # noqa: E731
    return RowLog(
        header=dict(header),
        seg_question=np.array([str(s["question"]) for s in segments], dtype=str),
        seg_task=np.array([str(s["task"]) for s in segments], dtype=str),
        seg_turn=np.array([s["turn"] for s in segments], dtype=np.int32),
        seg_stopped=np.array([s["stopped"] for s in segments], dtype=np.bool_),
        prompt_tokens=_flat([s["prompt"] for s in segments], np.int32),
        prompt_offsets=_offsets([s["prompt"] for s in segments]),
        traj_tokens=_flat([s["trajectory"] for s in segments], np.int32),
        traj_offsets=_offsets([s["trajectory"] for s in segments]),
        rec_segment=np.array([i for i, _ in recs], dtype=np.int32),
        rec_position=np.array(col("position"), dtype=np.int32),
        rec_scored=np.array(col("scored"), dtype=np.bool_),
        pool_offsets=_offsets(col("tokens")),
        first_offsets=_offsets(col("stale_p")),
        root_offsets=_offsets(col("root_tokens")),
        pool_tokens=_flat(col("tokens"), np.int32),
        pool_parents=_flat(col("parents"), np.int16),
        pool_logq=_flat(col("logq"), np.float32),
        edge_p=_flat(col("edge_p"), np.float32),
        stale_p=_flat(col("stale_p"), np.float32),
        root_tokens=_flat(col("root_tokens"), np.int32),
        root_p=_flat(col("root_p"), np.float32),
        prompt_topk=_topk(segments, "prompt_topk"),
        traj_topk=_topk(segments, "traj_topk"),
    )


def concat(logs: list[RowLog], header: dict) -> RowLog:
    """One log holding the segments of `logs` in order, under `header`."""
    if not logs:
        raise ValueError("no row logs to concatenate")
    out = {}
    for name in _ARRAYS:
        parts = [getattr(log, name) for log in logs]
        if name.endswith("_offsets"):
            flat = _OFFSETS[name][0][0]
            base = np.cumsum([0] + [len(getattr(log, flat)) for log in logs[:-1]])
            shifted = [p[1:] + b for p, b in zip(parts, base, strict=True)]
            out[name] = np.concatenate([parts[0][:1], *shifted])
        elif name in _TOPK and not all(log.has_path_rows for log in logs):
            out[name] = _no_topk()  # a log without them: the whole has none
        elif name == "rec_segment":
            base = np.cumsum([0] + [log.n_segments for log in logs[:-1]])
            shifted = [p + b for p, b in zip(parts, base, strict=True)]
            out[name] = np.concatenate(shifted).astype(np.int32)
        else:
            out[name] = np.concatenate(parts)
    return RowLog(header=dict(header), **out)


def write(path: str | os.PathLike, log: RowLog) -> None:
    """Write `log` atomically: a temporary file in the same folder, fsync, then rename."""
    path = os.fspath(path)
    _validate(log, path)
    header = dict(log.header, format=FORMAT, version=VERSION)
    arrays = {"header": np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)}
    arrays.update({k: v.astype(str if _ARRAYS[k] == "U" else _ARRAYS[k], copy=False)
                   for k, v in log.arrays().items()})  # str, never object: no pickle
    with atomic_file(path) as f:
        savez(f, arrays)


def savez(file, arrays: dict[str, np.ndarray]) -> None:
    """`numpy.savez` (uncompressed, no pickle) with a fixed time stamp on every member, so the
    same arrays always give the same bytes (savez stamps the current time)."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def read(path: str | os.PathLike, require_complete: bool = True) -> RowLog:
    """Read and check a row log; any damage raises ValueError naming the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"row log {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {name: z[name] for name in z.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as err:
        raise ValueError(
            f"row log {path!r} is truncated or corrupted ({err}); record it again"
        ) from err
    if "header" not in data:
        raise ValueError(f"row log {path!r} is not a {FORMAT} file (no header array)")
    try:
        header = json.loads(data.pop("header").tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"row log {path!r} has a corrupted header ({err})") from err
    check_format(header, FORMAT, VERSION, f"row log {path!r}", "record it again")
    if require_complete and header.get("complete") is not True:
        raise ValueError(f"row log {path!r} is not complete (no completion marker): its "
                         "recording was interrupted; rerun `targetrows record` to finish it")
    for name in _TOPK:  # optional: absent from logs recorded before they were
        data.setdefault(name, _no_topk())
    missing = sorted(set(_ARRAYS) - set(data))
    if missing:
        raise ValueError(f"row log {path!r} lacks arrays {missing}; record it again")
    log = RowLog(header=header, **{k: data[k] for k in _ARRAYS})
    _validate(log, path)
    return log


def _validate(log: RowLog, path: str) -> None:
    """Structural checks (offsets, owners, pool trees), vectorised; ValueError names the file."""

    def bad(what):
        raise ValueError(f"row log {path!r} is inconsistent: {what}; record it again")

    for name, (flats, owner) in _OFFSETS.items():
        off = getattr(log, name)
        n_owner = len(getattr(log, owner))
        if len(off) != n_owner + 1 or off[0] != 0 or np.any(np.diff(off) < 0):
            bad(f"{name} is not a valid offsets array for {n_owner} entries")
        for flat in flats:
            if len(getattr(log, flat)) != off[-1]:
                bad(f"{flat} has {len(getattr(log, flat))} entries, {name} says {off[-1]}")
    for name, tokens in _TOPK.items():
        rows, n = getattr(log, name), len(getattr(log, tokens))
        if rows.ndim != 2 or len(rows) != (n if rows.shape[1] else 0):
            bad(f"{name} is {rows.shape}: it needs one row per token ({n}), or none at all")
    n_seg = log.n_segments
    for name in ("seg_question", "seg_task", "seg_stopped"):
        if len(getattr(log, name)) != n_seg:
            bad(f"{name} has {len(getattr(log, name))} entries for {n_seg} segments")
    for name in ("rec_position", "rec_scored"):
        if len(getattr(log, name)) != log.n_records:
            bad(f"{name} has {len(getattr(log, name))} entries for {log.n_records} records")
    seg, pos = log.rec_segment.astype(np.int64), log.rec_position.astype(np.int64)
    if np.any((seg < 0) | (seg >= n_seg)):
        bad("a record names a segment that does not exist")
    key = seg << 32 | pos
    if np.any(np.diff(key) <= 0):
        bad("records are not sorted by (segment, position) without repeats")
    traj_len = np.diff(log.traj_offsets)
    if np.any((pos < 0) | (pos > traj_len[seg])):
        bad("a record's position lies outside its segment's trajectory")
    sizes = np.diff(log.pool_offsets)
    if np.any(sizes < 1):
        bad("a pool has no root node")
    if len(sizes) and np.all(sizes == sizes[0]):  # the usual case, in the parents' own dtype
        par = log.pool_parents.reshape(len(sizes), -1)
        rest = par[:, 1:]
        ok = np.all(par[:, 0] == -1) and np.all(
            (rest >= 0) & (rest < np.arange(1, par.shape[1], dtype=par.dtype)))
        n_first = np.count_nonzero(par == 0, axis=1)
    else:
        local = np.arange(len(log.pool_parents)) - np.repeat(log.pool_offsets[:-1], sizes)
        par = log.pool_parents.astype(np.int64)
        root = local == 0
        ok = np.all(par[root] == -1) and np.all((par[~root] >= 0) & (par[~root] < local[~root]))
        n_first = np.bincount(np.repeat(np.arange(len(sizes)), sizes)[par == 0],
                              minlength=len(sizes))
    if not ok:
        bad("a pool's parents are not topological (root -1, else 0 <= parent < node)")
    if not np.array_equal(n_first, np.diff(log.first_offsets)):
        bad("stale_p does not hold one value per first-level pool node")
