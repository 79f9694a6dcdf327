"""Record and replay (`--record DIR`, `--replay DIR [--from-step N]`): every model, tool and simulated-user call of
the built-in agent kept per attempt as a JSON file, and answered from it again with no network.

A replayed call is found by its request (canonical JSON, the n-th time that request was made in the attempt), so a
changed request is a miss, an infrastructure error naming the request. With `--from-step N` the first N calls of each
attempt are taken from the cassette by position whatever their request (the branch point of a counterfactual run),
and every later call is made live (and recorded, when recording too).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from evalsi.run_harness.model import AttemptFailed

Kind = Literal["model", "tool", "user"]
FORMAT = "evalsi.cassette/v1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _canonical(request: Any) -> str:
    return json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _digest(kind: str, request: Any) -> str:
    return hashlib.sha256(f"{kind}\x1f{_canonical(request)}".encode()).hexdigest()[:32]


def _summary(request: Any) -> str:
    text = _canonical(request)
    return text if len(text) <= 300 else text[:297] + "..."


def attempt_file(directory: Path, task_id: str, trial: int) -> Path:
    safe = _UNSAFE.sub("_", task_id)[:100] or "_"
    suffix = hashlib.sha256(task_id.encode()).hexdigest()[:8]
    return directory / f"{safe}-{suffix}" / f"trial-{trial}.json"


class Tape:
    """One attempt's calls: recorded as they happen, or answered from a recording."""

    def __init__(self, cassette: Cassette, task_id: str, trial: int) -> None:
        self.cassette = cassette
        self.task_id = task_id
        self.trial = trial
        self.path = attempt_file(cassette.replay_dir, task_id, trial) if cassette.replay_dir else None
        self.calls: list[dict[str, Any]] = []
        self._recorded: list[dict[str, Any]] = []
        self._by_request: dict[str, list[dict[str, Any]]] = {}
        self._used: dict[str, int] = {}
        if self.path is not None:
            try:
                doc = json.loads(self.path.read_text())
            except FileNotFoundError:
                doc = None
            except (OSError, ValueError) as e:
                raise AttemptFailed("cassette_miss", f"cassette {self.path}: unreadable: {e}") from None
            if doc is not None:
                self._recorded = list(doc.get("calls") or [])
            for call in self._recorded:
                self._by_request.setdefault(call["digest"], []).append(call)

    async def exchange(self, kind: Kind, request: Any, live: Callable[[], Awaitable[Any]]) -> tuple[Any, int | None]:
        """The response to `request`: from the recording when replaying (with its recorded duration in ns), else
        from `live()` (recorded when recording; duration None: the caller measured it)."""
        position = len(self.calls)
        digest = _digest(kind, request)
        entry: dict[str, Any] = {"position": position, "kind": kind, "digest": digest, "request": request}
        self.calls.append(entry)  # the position is taken before awaiting: parallel calls keep their call order
        if self.cassette.replaying:
            branch = self.cassette.from_step
            if branch is None or position < branch:
                found = self._replayed(kind, request, digest, position, by_position=branch is not None)
                entry.update(response=found["response"], duration_ns=found.get("duration_ns"))
                return found["response"], found.get("duration_ns")
        start = time.perf_counter_ns()
        response = await live()
        entry.update(response=response, duration_ns=time.perf_counter_ns() - start)
        return response, None

    def _replayed(self, kind: Kind, request: Any, digest: str, position: int, *, by_position: bool) -> dict[str, Any]:
        where = f"task {self.task_id!r} trial {self.trial}, call {position + 1} ({kind})"
        if not self._recorded:
            raise AttemptFailed("cassette_miss", f"cassette miss: no recording of {where} in {self.path}")
        if by_position:
            if position < len(self._recorded) and self._recorded[position]["kind"] == kind:
                return self._recorded[position]
            raise AttemptFailed("cassette_miss", f"cassette miss: {where}: the recording has no {kind} call there")
        n = self._used.get(digest, 0)
        same = self._by_request.get(digest, [])
        if n < len(same):
            self._used[digest] = n + 1
            return same[n]
        expected = self._recorded[position] if position < len(self._recorded) else None
        hint = (f"; the recording's call {position + 1} was {expected['kind']} {_summary(expected['request'])}"
                if expected else f"; the recording has {len(self._recorded)} calls")  # fmt: skip
        raise AttemptFailed("cassette_miss", f"cassette miss: {where}: request not recorded: {_summary(request)}{hint}")

    def save(self) -> None:
        """Write the attempt's calls (recording only), atomically."""
        if self.cassette.record_dir is None:
            return
        path = attempt_file(self.cassette.record_dir, self.task_id, self.trial)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "task_id": self.task_id, "trial": self.trial,
               "calls": [c for c in self.calls if "response" in c]}  # fmt: skip
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1, default=str))
        tmp.replace(path)


class Cassette:
    """Recorded attempts: written to `record_dir`, read from `replay_dir` (both: a branched run recorded anew)."""

    def __init__(
        self, *, record_dir: Path | None = None, replay_dir: Path | None = None, from_step: int | None = None
    ) -> None:
        if from_step is not None and replay_dir is None:
            raise ValueError("--from-step needs --replay DIR")
        if replay_dir is not None and not replay_dir.is_dir():
            raise ValueError(f"--replay {replay_dir}: no such cassette directory (record one with --record)")
        if record_dir is not None and replay_dir is not None and record_dir.resolve() == replay_dir.resolve():
            raise ValueError("--record and --replay name the same directory: record a branched run elsewhere")
        self.record_dir = record_dir
        self.replay_dir = replay_dir
        self.from_step = from_step

    @property
    def replaying(self) -> bool:
        return self.replay_dir is not None

    def tape(self, task_id: str, trial: int) -> Tape:
        return Tape(self, task_id, trial)
