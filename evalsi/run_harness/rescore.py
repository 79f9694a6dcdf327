"""Re-scoring stored traces (a run's, or production traces chosen by CEL) with new evaluators, without running the
agent again: the scores land in the store as a new run, with its aggregates (the run-added metrics rebuilt from the
traces: `run_metrics`) and gates."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from evalsi import __version__
from evalsi.auth.keys import api_headers
from evalsi.run_harness.collector import CollectorLink
from evalsi.run_harness.dataset import load_dataset
from evalsi.run_harness.gates import check_gates, compile_gate
from evalsi.run_harness.run_metrics import measured_observations
from evalsi.run_harness.runner import (
    SCORE_BATCH,
    SCORE_WAIT_S,
    RunFailed,
    RunResult,
    answer_of,
    new_run_id,
    observations,
    read_stored_measures,
    summarize,
)
from evalsi.run_harness.spec import EvaluatorSpec, RunSpec
from evalsi.run_harness.stats import Observation


class Rescore:
    """`evalsi rescore`: which traces (`run_id` or `where`), with which evaluators (a run file's, or refs)."""

    def __init__(
        self,
        link: CollectorLink,
        *,
        evaluators: list[EvaluatorSpec],
        judge: dict[str, Any],
        gates: list[str],
        name: str,
        seed: int = 0,
        spec: RunSpec | None = None,
    ) -> None:
        self.link = link
        self.evaluators = evaluators
        self.judge = judge
        self.gates = [compile_gate(g) for g in gates]
        self.name = name
        self.seed = seed
        self.spec = spec
        self.run_id = new_run_id(name)
        self._client = httpx.Client(base_url=link.api_url, timeout=SCORE_WAIT_S + 60, headers=api_headers())

    def _api(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise RunFailed(f"the {self.link.where} did not answer {method} {path}: {e}") from None
        return answer_of(resp, self.link.where)

    def _references(self, manifest: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], str]:
        """The original dataset's references by task id, when the run file names the same data (same hash)."""
        if self.spec is None:
            return {}, "no run file: evaluators that need a reference are skipped"
        dataset = load_dataset(self.spec.path(self.spec.body.dataset.path))
        if dataset.hash != manifest.get("dataset", {}).get("hash"):
            return {}, f"{dataset.path} is not the data the run saw (its hash differs): references left out"
        return {t.id: {"reference": t.reference, "context": t.context} for t in dataset.tasks}, ""

    def traces_of_run(self, run_id: str) -> tuple[list[dict[str, Any]], str]:
        run = self._api("GET", f"/api/v1/runs/{run_id}")
        scores = self._api("GET", f"/api/v1/runs/{run_id}/scores")["scores"]
        refs, note = self._references(run["manifest"])
        seen: dict[str, dict[str, Any]] = {}
        for s in scores:
            if str(s.get("policy", "")).startswith("run:") and s["trace_id"] not in seen:
                extra = refs.get(s["task_id"], {})
                seen[s["trace_id"]] = {"trace_id": s["trace_id"], "task_id": s["task_id"], "trial": int(s["trial"]),
                                       **extra}  # fmt: skip
        if not seen:
            raise RunFailed(f"run {run_id} has no scored traces to re-score")
        return list(seen.values()), note

    def traces_where(self, where: str, since_ns: int, limit: int) -> list[dict[str, Any]]:
        found = self._api("POST", "/v1/traces/select", json={"where": where, "since_unix_nano": since_ns,
                                                              "limit": limit})["trace_ids"]  # fmt: skip
        if not found:
            raise RunFailed(f"no stored trace matches {where!r}")
        return [{"trace_id": t, "task_id": t, "trial": 0} for t in found]

    def run(self, traces: list[dict[str, Any]], source: dict[str, Any]) -> RunResult:
        manifest = {
            "run_id": self.run_id, "name": self.name, "evalsi_version": __version__, "rescore": source,
            "evaluators": [e.model_dump() for e in self.evaluators], "seed": self.seed,
            "started_unix_nano": time.time_ns(), "trials": max(t["trial"] for t in traces) + 1,
        }  # fmt: skip
        requests = (
            {"name": self.name, "evaluators": [e.model_dump() for e in self.evaluators], "judge": self.judge,
             "wait_s": 0, "traces": traces[at : at + SCORE_BATCH]}
            for at in range(0, len(traces), SCORE_BATCH)
        )  # fmt: skip
        try:
            added = measured_observations(read_stored_measures(self.link.api_url, self.link.where, traces))
            return scored_run(self._api, manifest, requests, seed=self.seed, gates=self.gates, added=added)
        finally:
            self._client.close()


def scored_run(
    api: Callable[..., Any],
    manifest: dict[str, Any],
    requests: Iterable[dict[str, Any]],
    *,
    seed: int,
    gates: list[Any] | None = None,
    attempts: int = 0,
    infra: list[dict[str, Any]] | None = None,
    added: dict[str, list[Observation]] | None = None,
) -> RunResult:
    """Record a run (`running`), send each scoring request of its traces, aggregate, check `gates`, and record it
    `finished` with its summary: what `rescore` and the importers share. `api(method, path, json=...)` answers
    the collector's JSON; `added` are metrics besides the scores (the run-added ones), unless a score has the name."""
    started = time.monotonic()
    run_id, name = manifest["run_id"], manifest["name"]
    api("POST", "/v1/runs", json={"run_id": run_id, "name": name, "status": "running", "manifest": manifest,
                                  "summary": {}})  # fmt: skip
    scores: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for body in requests:
        answer = api("POST", f"/v1/runs/{run_id}/score", json=body)
        scores += answer["scores"]
        missing.update(answer.get("missing", {}))
    by_name = observations(scores)
    for metric, obs in (added or {}).items():
        by_name.setdefault(metric, obs)
    metrics = summarize(by_name, seed=seed, trials=manifest["trials"])
    checked = check_gates(gates or [], {k: v.to_dict() for k, v in metrics.items()}, None)
    infra = list(infra or []) + [
        {"task_id": "", "trial": 0, "kind": "not_stored", "message": why, "trace_id": t} for t, why in missing.items()
    ]
    result = RunResult(
        run_id=run_id, name=name, manifest=manifest, metrics=metrics, gates=checked, infra_errors=infra,
        attempts=attempts, skipped_resumed=0, not_run=0, scores=scores, wall_s=time.monotonic() - started,
    )  # fmt: skip
    api("POST", "/v1/runs", json={"run_id": run_id, "name": name, "status": "finished", "manifest": manifest,
                                  "summary": result.summary()})  # fmt: skip
    return result
