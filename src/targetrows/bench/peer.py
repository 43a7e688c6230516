"""Peers: other engines timed inside `targetrows bench`, interleaved prompt by prompt with our
decoders, each in its own process (and its own environment: a peer is never a dependency).

A peer is a command that speaks JSON lines on stdin/stdout. It prints one line when it is ready,
``{"ready": true, "engine": "...", "config": {...}}``, then answers each request

    {"ids": [prompt token ids], "max_new_tokens": N, "temperature": T, "seed": S,
     "stop_ids": [...]}

with ``{"tokens": [new token ids], "seconds": wall seconds of its own generate call}`` (plus
any ``"stats"``), or ``{"error": "..."}``. The prompt arrives as token ids, so that every method
decodes the same ids (no second chat template). ``benchmarks/vllm_peer.py`` is one: vLLM's
offline engine, with or without an EAGLE-3 head. A peer's stderr goes to the log file the
caller names (`targetrows bench`: beside its report), so that a chatty engine does not
interleave with the bench's progress.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "peer:"  # a peer's method name in the bench: "peer:<name>"


@dataclass(frozen=True)
class PeerSpec:
    """`--peer NAME=COMMAND`: the method name and the command that starts the worker."""

    name: str
    argv: tuple[str, ...]

    @property
    def method(self) -> str:
        return PREFIX + self.name

    @staticmethod
    def parse(text: str) -> PeerSpec:
        name, sep, command = text.partition("=")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"--peer {text!r}: give NAME=COMMAND, e.g. "
                             "vllm='/opt/vllm/bin/python benchmarks/vllm_peer.py --target T'")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--peer {text!r}: the name {name!r} may hold letters, digits, "
                             "'-' and '_' only")
        return PeerSpec(name.strip(), tuple(shlex.split(command)))


class Peer:
    """One running peer process (a context manager: the process ends with the block)."""

    def __init__(self, spec: PeerSpec, log_path: str | None = None, timeout_s: float = 900):
        self.spec = spec
        self.timeout_s = timeout_s
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(list(spec.argv), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._log, text=True,
                                          bufsize=1, env=os.environ.copy())
        except OSError as err:
            raise ValueError(f"peer {spec.name}: cannot start {spec.argv[0]!r} ({err})") from None
        ready = self._read()
        if not ready.get("ready"):
            self.close()
            raise ValueError(f"peer {spec.name}: expected a ready line, got {ready}")
        self.engine = str(ready.get("engine", spec.name))
        self.config = dict(ready.get("config", {}))

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.poll()
            raise ValueError(f"peer {self.spec.name} ended (exit status {code}) without an "
                             "answer; run its command alone to see why")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"peer {self.spec.name}: not a JSON line: {line[:200]!r}") from None

    def generate(self, ids: Sequence[int], max_new_tokens: int, temperature: float, seed: int,
                 stop_ids: Sequence[int]) -> tuple[list[int], float, dict]:
        """(new tokens, the peer's own wall seconds, its stats) for one prompt."""
        request = {"ids": list(map(int, ids)), "max_new_tokens": int(max_new_tokens),
                   "temperature": float(temperature), "seed": int(seed),
                   "stop_ids": sorted(map(int, stop_ids))}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise ValueError(f"peer {self.spec.name}: {answer['error']}")
        return [int(t) for t in answer["tokens"]], float(answer["seconds"]), answer.get("stats", {})

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
