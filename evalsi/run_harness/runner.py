"""A run from start to summary: every task and trial attempted with bounded concurrency and budgets, each attempt sent
to the collector as a trace and scored there by the run's evaluators, then aggregates (the evaluators' scores and the
run-added metrics of every attempt, earlier ones' included on --resume), gates and the run record."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from evalsi import __version__
from evalsi.auth.keys import api_headers
from evalsi.run_harness.calibration import run_calibration
from evalsi.run_harness.cassette import Cassette
from evalsi.run_harness.collector import CollectorLink
from evalsi.run_harness.compare import compare_scores
from evalsi.run_harness.dataset import Dataset
from evalsi.run_harness.environment import TaskEnvironment, check_trust, has_scripts, script
from evalsi.run_harness.faults import FaultPlan
from evalsi.run_harness.gates import GateResult, check_gates, compile_gate
from evalsi.run_harness.model import Attempt, InfraError, Task, UserTurn, faults_of
from evalsi.run_harness.run_metrics import (
    Measured,
    attempt_measures,
    measured_observations,
    stored_measures,
    with_measures,
)
from evalsi.run_harness.spec import RunSpec
from evalsi.run_harness.stats import MetricSummary, Observation, aggregate
from evalsi.run_harness.targets.base import (
    AgentTarget,
    AttemptContext,
    AttemptFailed,
    TargetError,
    concurrency_limit,
    conversational,
    grace_s,
)
from evalsi.run_harness.tracing import RunTracer
from evalsi.run_harness.users import SimulatedUser, converse, is_conversation, make_user

SCORE_BATCH = 200
"""Attempts scored per request to the collector."""
SCORE_WAIT_S = 60.0
BOOTSTRAP_DRAWS = 2_000_000
"""Bootstrap work per numeric metric (resamples times values); resamples go down for large runs, and are recorded."""


class RunFailed(Exception):
    """The run could not be carried out (collector unreachable, scoring refused); exit code 2."""


def answer_of(resp: httpx.Response, where: str) -> Any:
    """The JSON of a collector API answer; `RunFailed` with the API's own detail for anything but a 2xx."""
    if resp.status_code >= 300:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise RunFailed(f"the {where} answered {resp.request.method} {resp.request.url.path} with "
                        f"{resp.status_code}: {detail}")  # fmt: skip
    return resp.json()


def score_request(
    name: str,
    evaluators: list[dict[str, Any]],
    judge: dict[str, Any],
    since_ns: int,
    batch: list[tuple[Attempt, int]],
) -> dict[str, Any]:
    """The body of `POST /v1/runs/{id}/score` for attempts already traced (each with the spans it sent): the
    evaluators to run, and each trace's task, trial, reference and given scores (a checker's, an import's)."""
    return {
        "name": name,
        "evaluators": evaluators,
        "judge": judge,
        "since_unix_nano": min([since_ns, *(a.earliest_ns() - 60_000_000_000 for a, _ in batch)]),
        "wait_s": SCORE_WAIT_S,
        "traces": [
            {"trace_id": a.trace_id, "task_id": a.task.id, "trial": a.trial, "spans": sent,
             "reference": a.task.reference, "context": a.task.context, "scores": [g.to_dict() for g in a.scores]}
            for a, sent in batch
        ],
    }  # fmt: skip


def _cannot_converse(talks: list[Task], kind: str) -> str:
    return (
        f"{len(talks)} task(s) are conversations (a `user` in the run spec or in the task's metadata), e.g. "
        f"{talks[0].id!r}; a {kind} target cannot hold one (use the built-in `openai` agent, or a `python` function "
        "taking `messages`)"
    )


def run_problems(spec: RunSpec, tasks: list[Task]) -> list[str]:
    """What makes a run impossible before any attempt (also what `evalsi validate -f` reports): nothing scores it,
    task scripts the spec does not trust, conversations for a target that cannot hold one."""
    body = spec.body
    problems = []
    if not body.evaluators and not any(t.folder is not None and script(t.folder, "check") for t in tasks):
        problems.append(
            "spec.evaluators: nothing scores this run: list evaluators, or use task folders with a `check` script"
        )
    try:
        check_trust(tasks, body.environment)
    except TargetError as e:
        problems.append(str(e))
    talks = [t for t in tasks if is_conversation(t, body.user)]
    if talks and body.target.kind in ("command", "http"):
        problems.append(_cannot_converse(talks, body.target.kind))
    return problems


def read_stored_measures(api_url: str, where: str, scores: list[dict[str, Any]]) -> list[Measured]:
    """The run-added measures of the attempts behind stored scores, rebuilt from their traces in the store (read
    through the API at `api_url`, `where` naming it in errors)."""
    with httpx.Client(base_url=api_url, timeout=60, headers=api_headers()) as client:

        def get(path: str) -> Any:
            try:
                resp = client.get(path)
            except httpx.HTTPError as e:
                raise RunFailed(f"the {where} did not answer GET {path}: {e}") from None
            return None if resp.status_code == 404 else answer_of(resp, where)

        return stored_measures(get, scores)


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass
class Progress:
    """What the progress display shows, updated as attempts end."""

    total: int
    done: int = 0
    infra_errors: int = 0
    cost_usd: float = 0.0
    tokens: int = 0
    on_change: Callable[[Progress], None] | None = None

    def tick(self, attempt: Attempt) -> None:
        self.done += 1
        self.infra_errors += attempt.error is not None
        self.cost_usd += attempt.cost_usd
        self.tokens += attempt.tokens
        if self.on_change is not None:
            self.on_change(self)


@dataclass
class RunResult:
    run_id: str
    name: str
    manifest: dict[str, Any]
    metrics: dict[str, MetricSummary]
    gates: list[GateResult]
    infra_errors: list[dict[str, Any]]
    attempts: int
    skipped_resumed: int
    not_run: int
    scores: list[dict[str, Any]] = field(default_factory=list)
    comparison: dict[str, dict[str, Any]] | None = None
    judge_calibration: list[dict[str, Any]] = field(default_factory=list)
    """Each evaluator against people's verdicts in the dataset (`reference.labels`), when it carries some."""
    wall_s: float = 0.0
    agent_s: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    """Injected faults by kind."""
    workdirs: list[str] = field(default_factory=list)
    """Working directories kept (`environment.keep_workdirs`)."""

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    def summary(self) -> dict[str, Any]:
        return {
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "gates": [g.to_dict() for g in self.gates],
            "passed": self.passed,
            "infra_errors": self.infra_errors,
            "attempts": self.attempts,
            "skipped_resumed": self.skipped_resumed,
            "not_run": self.not_run,
            "comparison": self.comparison,
            "judge_calibration": self.judge_calibration,
            "wall_s": round(self.wall_s, 3),
            "agent_s": round(self.agent_s, 3),
            "faults": self.faults,
            "workdirs": self.workdirs,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "manifest": self.manifest, **self.summary()}


def manifest_of(spec: RunSpec, dataset: Dataset, target: AgentTarget, run_id: str) -> dict[str, Any]:
    judge = spec.body.judge
    agent = spec.body.target
    model = agent.openai.model if agent.openai else agent.http.model if agent.http else None
    return {
        "run_id": run_id,
        "name": spec.name,
        "labels": spec.doc.metadata.labels,
        "evalsi_version": __version__,
        "spec_hash": spec.hash,
        "dataset": {"path": str(dataset.path), "hash": dataset.hash, "tasks": len(dataset.tasks)},
        "target": target.identity,
        "model": model,  # the target's model (`--model` changes it), None when the run file names none
        "trials": spec.body.trials,
        "evaluators": [{"ref": ref, "version": ev.version} for ref, ev, _ in spec.evaluators],
        "judge": {"model": judge.get("model"), "endpoint": judge.get("endpoint")} if judge else None,
        "seed": spec.body.seed,
        "started_unix_nano": time.time_ns(),
    }


class Runner:
    def __init__(
        self,
        spec: RunSpec,
        dataset: Dataset,
        target: AgentTarget,
        link: CollectorLink,
        *,
        run_id: str | None = None,
        resume: bool = False,
        baseline: str | None = None,
        progress: Callable[[Progress], None] | None = None,
        cassette: Cassette | None = None,
    ) -> None:
        self.spec = spec
        self.dataset = dataset
        self.target = target
        self.link = link
        self.run_id = run_id or new_run_id(spec.name)
        self.resume = resume
        self.baseline = baseline
        self.progress_hook = progress
        self.gates = [compile_gate(g.when) for g in spec.body.gates]
        self._client = httpx.AsyncClient(base_url=link.api_url, timeout=SCORE_WAIT_S + 60)
        self._attempts: list[Attempt] = []
        self._scores: list[dict[str, Any]] = []
        self._missing: dict[str, str] = {}
        self._agent_ns = 0
        self._spent_usd = 0.0
        self._spent_tokens = 0
        self._stop_reason: str | None = None
        self._grace = 0.0
        self.cassette = cassette
        self.faults = FaultPlan(spec.body.faults, spec.body.seed)
        self.environment = TaskEnvironment(spec.body.environment)
        self._user: SimulatedUser | None = None

    # --- the collector's API -----------------------------------------------------------------------------------

    async def _api(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise RunFailed(f"the {self.link.where} did not answer {method} {path}: {e}") from None
        return answer_of(resp, self.link.where)

    async def _record(self, status: str, manifest: dict[str, Any], summary: dict[str, Any]) -> None:
        body = {"run_id": self.run_id, "name": self.spec.name, "status": status, "manifest": manifest,
                "summary": summary}  # fmt: skip
        await self._api("POST", "/v1/runs", json=body)

    async def stored_scores(self, run_id: str) -> list[dict[str, Any]]:
        """A run's scores from the store: those its own evaluators gave (online policies may score its traces too)."""
        found = await self._api("GET", f"/api/v1/runs/{run_id}/scores")
        return [s for s in found["scores"] if str(s.get("policy", "")).startswith("run:")]

    async def _done_pairs(self) -> set[tuple[str, int]]:
        """For --resume: the (task, trial) pairs that already have scores in this run."""
        return {(s["task_id"], int(s["trial"])) for s in await self.stored_scores(self.run_id)}

    # --- attempts ----------------------------------------------------------------------------------------------

    def _over_budget(self) -> str | None:
        budget = self.spec.body.budget
        if budget.usd is not None and self._spent_usd >= budget.usd:
            return f"the run's budget of {budget.usd:g} USD is spent ({self._spent_usd:.4f} USD)"
        if budget.tokens is not None and self._spent_tokens >= budget.tokens:
            return f"the run's budget of {budget.tokens} tokens is spent ({self._spent_tokens})"
        return None

    async def _agent(self, task: Task, ctx: AttemptContext) -> Attempt:
        """The target's attempt: a conversation with the run's user for a multi-turn task, else one call."""
        if is_conversation(task, self.spec.body.user):
            assert self._user is not None
            return await converse(self.target, self._user, task, ctx, self.spec.body.user)
        return await self.target.attempt(task, ctx)

    async def _attempt(self, tracer: RunTracer, task: Task, trial: int) -> tuple[Attempt, int]:
        root, traceparent = tracer.begin(task.id, trial, "")
        tape = self.cassette.tape(task.id, trial) if self.cassette is not None else None
        ctx = AttemptContext(trial=trial, timeout_s=self.spec.body.timeout, traceparent=traceparent, run_id=self.run_id,
                             tape=tape, faults=self.faults.for_attempt(task.id, trial))  # fmt: skip
        if self.environment.applies(task):
            work = self.environment.run(task, ctx, lambda c: self._agent(task, c))
        else:
            work = self._agent(task, ctx)
        t0 = time.perf_counter_ns()
        try:
            # the target stops its agent at the timeout itself; past its grace, the runner gives up on it
            attempt = await asyncio.wait_for(work, self.spec.body.timeout + self._grace)
        except AttemptFailed as e:
            attempt = e.attempt if e.attempt is not None else Attempt(task, trial)
            attempt.error = e.error
        except TimeoutError:
            attempt = Attempt(task, trial, error=InfraError("timeout", f"no answer in {self.spec.body.timeout:g}s"))
        except Exception as e:  # a target's bug: this attempt fails, the run goes on
            attempt = Attempt(task, trial, error=InfraError("crash", f"{type(e).__name__}: {e}"))
        self._agent_ns += time.perf_counter_ns() - t0
        if tape is not None:
            tape.save()
        attempt.trial = trial
        if not attempt.end_ns:
            attempt.end_ns = time.time_ns()
        self._spent_usd += attempt.cost_usd
        self._spent_tokens += attempt.tokens + sum(
            (s.input_tokens or 0) + (s.output_tokens or 0) for s in attempt.steps if isinstance(s, UserTurn)
        )
        sent = tracer.finish(root, attempt)
        return attempt, sent

    async def _score(self, batch: list[tuple[Attempt, int]], since_ns: int, tracer: RunTracer) -> None:
        await asyncio.to_thread(tracer.flush)
        spec = self.spec.body
        body = score_request(self.spec.name, [s.model_dump() for s in spec.evaluators], spec.judge, since_ns, batch)
        answer = await self._api("POST", f"/v1/runs/{self.run_id}/score", json=body)
        self._scores.extend(answer["scores"])
        self._missing.update(answer.get("missing", {}))

    async def run(self) -> RunResult:
        started = time.monotonic()
        since_ns = time.time_ns() - 60_000_000_000  # a minute of clock skew between here and the collector
        spec = self.spec.body
        manifest = manifest_of(self.spec, self.dataset, self.target, self.run_id)
        done: set[tuple[str, int]] = await self._done_pairs() if self.resume else set()
        pairs = [(t, k) for t in self.dataset.tasks for k in range(spec.trials) if (t.id, k) not in done]
        await self._prepare()
        workers = min(spec.concurrency, concurrency_limit(self.target) or spec.concurrency, max(1, len(pairs)))
        await self._record("running", manifest, {})
        tracer = RunTracer(self.link.otlp_url, self.run_id, self.spec.name)
        progress = Progress(total=len(pairs), on_change=self.progress_hook)
        to_score: asyncio.Queue[tuple[Attempt, int] | None] = asyncio.Queue()
        scorer = asyncio.create_task(self._scoring_loop(to_score, since_ns, tracer))
        work = iter(pairs)
        not_run = 0

        async def worker() -> None:
            nonlocal not_run
            for task, trial in work:
                if self._stop_reason is None:
                    self._stop_reason = self._over_budget()
                if self._stop_reason is not None:
                    not_run += 1
                    continue
                attempt, sent = await self._attempt(tracer, task, trial)
                self._attempts.append(attempt)
                progress.tick(attempt)
                if attempt.error is None:
                    to_score.put_nowait((attempt, sent))

        try:
            await asyncio.gather(*(worker() for _ in range(workers)))
            to_score.put_nowait(None)
            await scorer
        finally:
            if not scorer.done():
                scorer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await scorer
            await asyncio.to_thread(tracer.flush)
            tracer.shutdown()
            await self.target.close()
            if self._user is not None:
                await self._user.close()
        result = await self._result(manifest, done, not_run, time.monotonic() - started)
        await self._record("finished", manifest, result.summary())
        await self._client.aclose()
        return result

    async def _prepare(self) -> None:
        """Check the run can be done before the first attempt: something scores it, its task scripts are trusted,
        its target can hold its conversations; then prepare the target and the user."""
        spec, tasks = self.spec.body, self.dataset.tasks
        problems = run_problems(self.spec, tasks)
        if problems:
            raise TargetError("\n".join(problems))
        await self.target.prepare(tasks)
        talks = [t for t in tasks if is_conversation(t, spec.user)]
        if talks and not conversational(self.target):
            raise TargetError(_cannot_converse(talks, self.target.identity.split(":", 1)[0]))
        if talks:
            self._user = make_user(spec.user, self.spec.base_dir)
        # a target that stops its agent itself (even with no grace) does it before the runner gives up on it
        own_grace = grace_s(self.target)
        self._grace = own_grace + 5.0 if own_grace is not None else 0.0
        if any(has_scripts(t) for t in tasks):  # the scripts' time comes on top of the agent's
            env = spec.environment
            self._grace += env.setup_timeout + env.check_timeout + env.teardown_timeout

    async def _scoring_loop(
        self, queue: asyncio.Queue[tuple[Attempt, int] | None], since_ns: int, tracer: RunTracer
    ) -> None:
        """Score finished attempts in batches while others still run: the collector waits for each trace."""
        batch: list[tuple[Attempt, int]] = []
        last = time.monotonic()
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:  # nothing new: a batch waiting for 2 s goes anyway
                pass
            else:
                if item is None:  # every attempt is done
                    if batch:
                        await self._score(batch, since_ns, tracer)
                    return
                batch.append(item)
            if len(batch) >= SCORE_BATCH or (batch and time.monotonic() - last >= 2.0):
                await self._score(batch, since_ns, tracer)
                batch, last = [], time.monotonic()

    # --- the summary -------------------------------------------------------------------------------------------

    async def _result(
        self, manifest: dict[str, Any], done: set[tuple[str, int]], not_run: int, wall_s: float
    ) -> RunResult:
        measured = [(a.task.id, a.trial, attempt_measures(a)) for a in self._attempts if a.error is None]
        if self.resume:  # the scores and measures of the attempts before the interruption count too
            scores = await self.stored_scores(self.run_id)
            earlier = [s for s in scores if (s["task_id"], int(s["trial"])) in done]
            measured = (
                await asyncio.to_thread(read_stored_measures, self.link.api_url, self.link.where, earlier) + measured
            )
        else:
            scores = self._scores
        metrics = self._metrics(scores, measured)
        comparison = None
        if self.baseline:
            base = await self.stored_scores(self.baseline)
            base_measured = await asyncio.to_thread(read_stored_measures, self.link.api_url, self.link.where, base)
            comparison = compare_scores(
                with_measures(base, base_measured), with_measures(scores, measured), seed=self.spec.body.seed
            )
        gates = check_gates(self.gates, {k: v.to_dict() for k, v in metrics.items()}, comparison)
        infra = [
            {"task_id": a.task.id, "trial": a.trial, "kind": a.error.kind, "message": a.error.message,
             "trace_id": a.trace_id}
            for a in self._attempts if a.error is not None
        ]  # fmt: skip
        by_trace = {a.trace_id: a for a in self._attempts}
        for trace_id, why in self._missing.items():
            a = by_trace.get(trace_id)
            infra.append({"task_id": a.task.id if a else "", "trial": a.trial if a else 0, "kind": "not_stored",
                          "message": why, "trace_id": trace_id})  # fmt: skip
        return RunResult(
            run_id=self.run_id, name=self.spec.name, manifest=manifest, metrics=metrics, gates=gates,
            infra_errors=infra, attempts=len(self._attempts), skipped_resumed=len(done), not_run=not_run,
            scores=scores, comparison=comparison, judge_calibration=run_calibration(self.dataset.tasks, scores),
            wall_s=wall_s, agent_s=self._agent_ns / 1e9,
            faults=self._fault_counts(), workdirs=[str(p) for p in self.environment.kept],
        )  # fmt: skip

    def _fault_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self._attempts:
            for fault in faults_of(a.steps):
                counts[fault.kind] = counts.get(fault.kind, 0) + 1
        return counts

    def _metrics(self, scores: list[dict[str, Any]], measured: list[Measured]) -> dict[str, MetricSummary]:
        """The evaluators' metrics and the run-added ones (unless an evaluator gives a score of the same name)."""
        by_name = observations(scores)
        for name, obs in measured_observations(measured).items():
            by_name.setdefault(name, obs)
        return summarize(by_name, seed=self.spec.body.seed, trials=self.spec.body.trials)


def observations(scores: list[dict[str, Any]]) -> dict[str, list[Observation]]:
    """Scores (as the API answers them) as each metric's observations, by score name."""
    by_name: dict[str, list[Observation]] = {}
    for s in scores:
        by_name.setdefault(s["name"], []).append(
            Observation(s["task_id"], int(s["trial"]), s.get("value"), s.get("passed"), s["outcome"])
        )
    return by_name


def summarize(by_name: dict[str, list[Observation]], *, seed: int, trials: int | None) -> dict[str, MetricSummary]:
    out = {}
    for name, obs in sorted(by_name.items()):
        resamples = max(200, min(10_000, BOOTSTRAP_DRAWS // max(1, len(obs))))
        out[name] = aggregate(name, obs, seed=seed, resamples=resamples, trials=trials)
    return out
