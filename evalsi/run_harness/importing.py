"""Importing other harnesses' results as evalsi runs (`evalsi import atif|inspect`): each attempt sent to the
collector as a trace like a live run's, scored there by the chosen evaluators, its own scores kept, the run recorded
so that `evalsi runs show`, `compare` and `rescore` treat it like any other."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from evalsi import __version__
from evalsi.auth.keys import api_headers
from evalsi.run_harness.atif import AtifError, convert
from evalsi.run_harness.collector import CollectorLink
from evalsi.run_harness.model import Attempt, DatasetError, Task
from evalsi.run_harness.rescore import scored_run
from evalsi.run_harness.runner import (
    SCORE_BATCH,
    SCORE_WAIT_S,
    RunFailed,
    RunResult,
    answer_of,
    new_run_id,
    score_request,
)
from evalsi.run_harness.tracing import RunTracer


def _text(message: Any) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, list):
        return "".join(p.get("text", "") for p in message if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def read_atif_files(paths: list[Path], references: dict[str, Task] | None = None) -> tuple[list[Task], list[Attempt]]:
    """One task and one attempt per ATIF file: the task's id is the document's `session_id` (else the file's name),
    its input the first user step's message, the answer the last agent step's message; the reference comes from the
    dataset task of the same id, when one is given. Raises `DatasetError` listing every file that cannot be read."""
    tasks: list[Task] = []
    attempts: list[Attempt] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except OSError as e:
            errors.append(f"{path}: cannot read: {e.strerror}")
            continue
        except ValueError as e:
            errors.append(f"{path}: not JSON: {e}")
            continue
        try:
            start_ns = time.time_ns()
            trajectory = convert(doc, start_ns)
        except AtifError as e:
            errors.append(f"{path}: {e}")
            continue
        task_id = str(doc.get("session_id") or path.stem)
        if task_id in seen:
            errors.append(f"{path}: task id {task_id!r} is already that of {seen[task_id]} (give each a session_id)")
            continue
        seen[task_id] = path
        steps = [s for s in doc.get("steps", []) if isinstance(s, dict)]
        question = next((_text(s.get("message")) for s in steps if s.get("source") == "user"), "")
        answer = next((_text(s.get("message")) for s in reversed(steps) if s.get("source") == "agent"), None)
        known = (references or {}).get(task_id)
        task = Task(task_id, question, known.reference if known else {}, known.context if known else [],
                    {"atif_file": str(path)})  # fmt: skip
        attempt = Attempt(task, 0, output=answer or None, steps=trajectory.steps, agent_name=trajectory.agent_name,
                          start_ns=start_ns)  # fmt: skip
        attempt.start_ns = attempt.earliest_ns()
        attempt.end_ns = max([attempt.start_ns, *(s.end_ns for s in attempt.steps)])
        tasks.append(task)
        attempts.append(attempt)
    if errors:
        raise DatasetError(errors)
    return tasks, attempts


def import_run(
    link: CollectorLink,
    name: str,
    attempts: list[Attempt],
    *,
    evaluators: list[dict[str, Any]],
    judge: dict[str, Any] | None = None,
    source: dict[str, Any],
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Trace, score and record imported attempts as a new run; `progress(n)` after each batch is scored."""
    run_id = new_run_id(name)
    manifest = {
        "run_id": run_id, "name": name, "labels": {}, "evalsi_version": __version__, "imported": source,
        "dataset": {"tasks": len({a.task.id for a in attempts})}, "target": f"imported:{source.get('format', '')}",
        "trials": max((a.trial for a in attempts), default=0) + 1, "evaluators": evaluators, "seed": seed,
        "started_unix_nano": time.time_ns(),
    }  # fmt: skip
    tracer = RunTracer(link.otlp_url, run_id, name)
    try:
        sent = []
        for a in attempts:
            root, _ = tracer.begin(a.task.id, a.trial, a.agent_name, start_ns=a.start_ns)
            sent.append((a, tracer.finish(root, a)))
        tracer.flush()
    finally:
        tracer.shutdown()
    good = [(a, n) for a, n in sent if a.error is None]
    since = min((a.start_ns for a in attempts), default=time.time_ns())

    def requests() -> Iterator[dict[str, Any]]:
        for at in range(0, len(good), SCORE_BATCH):
            batch = good[at : at + SCORE_BATCH]
            yield score_request(name, evaluators, judge or {}, since, batch)
            if progress is not None:
                progress(len(batch))

    infra = [{"task_id": a.task.id, "trial": a.trial, "kind": a.error.kind, "message": a.error.message,
              "trace_id": a.trace_id} for a in attempts if a.error is not None]  # fmt: skip
    with httpx.Client(base_url=link.api_url, timeout=SCORE_WAIT_S + 60, headers=api_headers()) as client:

        def api(method: str, path: str, **kwargs: Any) -> Any:
            try:
                resp = client.request(method, path, **kwargs)
            except httpx.HTTPError as e:
                raise RunFailed(f"the {link.where} did not answer {method} {path}: {e}") from None
            return answer_of(resp, link.where)

        return scored_run(api, manifest, requests(), seed=seed, attempts=len(attempts), infra=infra)
