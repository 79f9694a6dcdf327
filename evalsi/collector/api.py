"""The collector's HTTP API: liveness, readiness, the trace queries `evalsi traces` reads through, and the Score
API (`/v1/evaluate`, `/v1/feedback`, policy stats); every route behind the body limits of `body_limit`."""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from fastapi import Body, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.routing import Match

from evalsi.auth.asgi_gate import PRINCIPAL_SCOPE_KEY
from evalsi.auth.authenticator import Authenticator
from evalsi.capabilities import BodyAdmitter
from evalsi.collector import query, run_api, score_api
from evalsi.collector.body_limit import BodyLimit, Scope, limit_bodies
from evalsi.collector.config import ApiConfig
from evalsi.component import Refused, ScoreConsumer
from evalsi.duration import parse_duration
from evalsi.evaluators.judge_client import Judges
from evalsi.model.ids import is_trace_id
from evalsi.model.score import DEFAULT_PROJECT, Score, ScoreBatch
from evalsi.store import DatasetStore, TraceQueries

OPEN_PATHS = ("/healthz", "/readyz")
"""What answers without an API key (probes): everything else needs one when `auth` is on."""
BULK_ROUTES = frozenset({"/v1/evaluate", "/v1/runs/{run_id}/score"})
"""The routes whose bodies carry many records or traces with their texts: they take
`service.api.max_bulk_request_body_size`, every other route `service.api.max_request_body_size`."""


def build_api(
    store: TraceQueries | None,
    status: Callable[[], dict[str, Any]],
    scores: ScoreConsumer | None = None,
    not_ready: Callable[[], list[str]] = list,
    judges: Judges | None = None,
    auth: Authenticator | None = None,
    config: ApiConfig | None = None,
    memory: Sequence[BodyAdmitter] = (),
) -> FastAPI:
    """`config` sets the body limits of every route; `memory` (the memory_limiters) may refuse a request's body before
    it is read (see `body_limit`). `judges` is the service's judge runtime, which `/v1/evaluate` runs judge-based
    evaluators with (None: they are skipped). `scores` is where the `scores` pipelines begin: feedback enters there, as
    every score does, so the processors in those pipelines (`evaluate`'s late path) see it; without a scores pipeline it
    goes to `store`. `not_ready` lists why components cannot take data now (e.g. the store refuses writes): `/readyz`
    says so. With `auth` checking credentials, each request sees only its credential's project (`project_of`)."""
    app = FastAPI(title="evalsi", docs_url="/docs", redoc_url=None)
    app.add_middleware(limit_bodies, limit_of=_body_limits(app, config or ApiConfig()), guards=memory)
    isolated = auth is not None and auth.enabled

    def project_of(request: Request) -> str | None:
        """The project a request reads and writes: its credential's (anonymous, in `optional` mode: `default`);
        None (every project) when no credential is checked."""
        if not isolated:
            return None
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        return principal.project if principal is not None else DEFAULT_PROJECT

    def need_store() -> TraceQueries:
        if store is None:
            raise HTTPException(404, "no clickhouse exporter in this collector's pipelines: nothing to query")
        return store

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        reasons = not_ready()
        if reasons:
            raise HTTPException(503, "; ".join(reasons))
        if store is not None and not await asyncio.to_thread(store.ping):
            raise HTTPException(503, f"the {store.description} does not answer")
        return {"status": "ready"}

    @app.get("/api/v1/status")
    async def service_status() -> dict[str, Any]:
        return status()

    @app.get("/api/v1/traces")
    async def list_traces(
        request: Request,
        limit: int = Query(20, ge=1, le=10_000),
        service: str | None = Query(None, max_length=MAX_FILTER),
        since: str | None = Query(None, max_length=100),
        until: str | None = Query(None, max_length=100),
        error: bool | None = None,
        model: str | None = Query(None, max_length=MAX_FILTER),
        session: str | None = Query(None, max_length=MAX_FILTER),
        min_duration: str | None = Query(None, max_length=100),
        attr: list[str] = Query([]),  # noqa: B008
        failed: str | None = Query(None, max_length=MAX_FILTER),
        where: str | None = Query(None, max_length=MAX_WHERE),
        scan: int | None = Query(None, ge=1, le=query.MAX_SCAN),
    ) -> dict[str, Any]:
        """Traces newest first, narrowed by the filters given (see `query.search_traces`)."""
        given = {
            "limit": limit, "service": service, "since": since, "until": until, "error": error, "model": model,
            "session": session, "min_duration": min_duration, "attr": attr, "failed": failed, "where": where,
            "scan": scan,
        }  # fmt: skip
        params = {k: v for k, v in given.items() if v is not None and v != []}
        return await _searched(query.search_traces, need_store(), params, project_of(request))

    async def _searched(search: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(search, *args, **kwargs)
        except query.SearchError as e:
            raise HTTPException(400, str(e)) from None

    @app.get("/api/v1/scores")
    async def list_scores(
        request: Request,
        limit: int = Query(100, ge=1, le=100_000),
        trace_id: str | None = None,
        policy: str | None = Query(None, max_length=MAX_FILTER),
    ) -> dict[str, Any]:
        if trace_id is not None:
            _check_trace_id("trace_id", trace_id)
        s = need_store()
        project = project_of(request)
        found = await asyncio.to_thread(s.list_scores, limit=limit, trace_id=trace_id, policy=policy, project=project)
        return {"scores": found}

    @app.get("/api/v1/traces/{trace_id}")
    async def get_trace(
        request: Request,
        trace_id: str,
        limit: int = Query(query.TRACE_PAGE, ge=1, le=query.MAX_TRACE_PAGE),
        offset: int = Query(0, ge=0, le=2**63 - 1),
    ) -> dict[str, Any]:
        """At most `limit` spans of the trace from `offset`; `truncated` and `next_offset` say when more follow."""
        _check_trace_id("trace_id", trace_id)
        project = project_of(request)
        doc = await _searched(query.read_trace, need_store(), trace_id, limit=limit, offset=offset, project=project)
        if doc is None:
            raise HTTPException(404, f"trace {trace_id} not found")
        return cast(dict[str, Any], doc)

    @app.post("/api/v1/spans/stored")
    async def stored_spans(request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Which spans of these traces the store holds, as [trace id, span id] pairs: what `evalsi import` (or any
        re-sender) leaves out, so a span is stored once."""
        trace_ids = body.get("trace_ids") if isinstance(body, dict) else None
        if not isinstance(trace_ids, list) or set(body) != {"trace_ids"}:
            raise HTTPException(400, 'body: expected {"trace_ids": [32 hex digits, ...]} and nothing else')
        if len(trace_ids) > MAX_STORED_SPANS_TRACES:
            raise HTTPException(
                413, f"trace_ids: {len(trace_ids)} in one request; at most {MAX_STORED_SPANS_TRACES}, split them"
            )
        for i, t in enumerate(trace_ids):
            if not isinstance(t, str):
                raise HTTPException(400, f"trace_ids.{i}: expected a string of 32 hex digits")
            _check_trace_id(f"trace_ids.{i}", t)
        keys = await asyncio.to_thread(
            functools.partial(need_store().stored_span_keys, project=project_of(request)),
            sorted({t.lower() for t in trace_ids}),
        )
        return {"spans": sorted([t, s] for t, s in keys)}

    @app.get("/api/v1/sessions")
    async def list_sessions(
        request: Request,
        limit: int = Query(20, ge=1, le=10_000),
        since: str | None = Query(None, max_length=100),
        until: str | None = Query(None, max_length=100),
    ) -> dict[str, Any]:
        """Sessions, the most recently active first."""
        params = {k: v for k, v in {"limit": limit, "since": since, "until": until}.items() if v is not None}
        return {"sessions": await _searched(query.list_sessions, need_store(), params, project_of(request))}

    @app.get("/api/v1/sessions/{session_id:path}")
    async def get_session(
        request: Request, session_id: str, limit: int = Query(1000, ge=1, le=10_000)
    ) -> dict[str, Any]:
        """A session's traces, oldest first, and its scores (of the session and of its traces)."""
        if len(session_id) > MAX_FILTER:
            raise HTTPException(400, f"session_id: {len(session_id)} characters; at most {MAX_FILTER}")
        project = project_of(request)
        doc = await _searched(query.show_session, need_store(), session_id, limit=limit, project=project)
        if doc is None:
            raise HTTPException(404, f"session {session_id[:200]!r} not found")
        return cast(dict[str, Any], doc)

    # --- the Score API -------------------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A body that is not JSON (or a bad query parameter) is the client's error: 400 saying what, not 422."""
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"detail": f"invalid request: {where}: {first.get('msg', 'malformed')}"}, status_code=400)

    running = [0]  # evaluations on their threads, a runaway one included until it returns

    @app.post("/v1/evaluate")
    async def evaluate(body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        """On threads of its own: a slow or runaway evaluation never holds the ones other routes wait on."""
        try:  # in a thread too: the first request imports every evaluator pack (~0.6 s), which must not hold the loop
            plan = await asyncio.to_thread(score_api.plan_evaluation, body)
        except score_api.RequestError as e:
            raise HTTPException(e.status, str(e)) from None
        if running[0] >= score_api.EVALUATE_THREADS:
            raise HTTPException(
                429, f"{running[0]} evaluations are running (at most {score_api.EVALUATE_THREADS}); retry later",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        running[0] += 1
        deadline = time.monotonic() + score_api.EVALUATE_DEADLINE_S
        done = _on_own_thread(score_api.evaluate, plan, judges, deadline)
        done.add_done_callback(lambda _: running.__setitem__(0, running[0] - 1))
        try:
            return await asyncio.wait_for(asyncio.shield(done), score_api.EVALUATE_DEADLINE_S + 1)
        except TimeoutError:
            raise HTTPException(
                504, f"an evaluator ran past the request's {score_api.EVALUATE_DEADLINE_S:g} s deadline"
            ) from None

    @app.post("/v1/feedback")
    async def feedback(request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        try:
            score = score_api.feedback_score(body)
        except score_api.RequestError as e:
            raise HTTPException(e.status, str(e)) from None
        score.project = project_of(request) or DEFAULT_PROJECT  # a verdict lands in its sender's project only
        if scores is None:
            await asyncio.to_thread(need_store().write_scores, [score])
            return {"stored": score_api.score_record(score)}
        try:
            await scores.consume_scores(ScoreBatch([score]))
        except Refused as e:
            raise HTTPException(
                503 if e.unavailable else 429, str(e), headers={"Retry-After": str(max(1, math.ceil(e.retry_after)))}
            ) from None
        return {"stored": score_api.score_record(score)}

    # --- offline runs (`evalsi run`) ---------------------------------------------------------------------

    @app.post("/v1/runs/{run_id}/score")
    async def score_run(request: Request, run_id: str, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Score a run's traces once they are stored; the scores go where every score goes (the scores pipeline,
        else the store) and come back in the answer."""
        try:
            plan = run_api.plan_scoring(run_id, body)
        except run_api.RunRequestError as e:
            raise HTTPException(e.status, str(e)) from None
        s = need_store()
        project = project_of(request)
        traces, missing = await asyncio.to_thread(run_api.wait_for_traces, s, plan, project)
        found = await asyncio.to_thread(run_api.score_traces, plan, traces, judges, project or DEFAULT_PROJECT)
        if found:
            await _hand_on_scores(found, deadline=time.monotonic() + max(5.0, plan.request.wait_s))
        return {"scores": [run_api.score_dict(x) for x in found], "missing": missing}

    async def _hand_on_scores(found: list[Score], deadline: float) -> None:
        if scores is None:
            await asyncio.to_thread(need_store().write_scores, found)
            return
        while True:
            try:
                await scores.consume_scores(ScoreBatch(found))
                return
            except Refused as e:
                if time.monotonic() + e.retry_after > deadline:
                    raise HTTPException(
                        503 if e.unavailable else 429, str(e),
                        headers={"Retry-After": str(max(1, math.ceil(e.retry_after)))},
                    ) from None  # fmt: skip
                await asyncio.sleep(e.retry_after)

    @app.post("/v1/traces/select")
    async def select_traces(request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Stored trace ids matching a CEL condition over `trace` (for re-scoring stored traces)."""
        try:
            found = await asyncio.to_thread(run_api.select_traces, need_store(), body, project_of(request))
        except run_api.RunRequestError as e:
            raise HTTPException(e.status, str(e)) from None
        return {"trace_ids": found}

    @app.post("/v1/runs")
    async def record_run(request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        try:
            r = run_api.parse_run_record(body)
        except run_api.RunRequestError as e:
            raise HTTPException(e.status, str(e)) from None
        project = project_of(request) or DEFAULT_PROJECT
        await asyncio.to_thread(
            need_store().write_run, r.run_id, r.name, r.status, r.manifest, r.summary, project=project
        )
        return {"run_id": r.run_id, "status": r.status}

    @app.get("/api/v1/runs")
    async def list_runs(request: Request, limit: int = Query(20, ge=1, le=10_000)) -> dict[str, Any]:
        return {"runs": await asyncio.to_thread(need_store().list_runs, limit=limit, project=project_of(request))}

    @app.get("/api/v1/runs/{run_id}")
    async def get_run(request: Request, run_id: str) -> dict[str, Any]:
        _check_run_id(run_id)
        found = await asyncio.to_thread(need_store().list_runs, limit=1, run_id=run_id, project=project_of(request))
        if not found:
            raise HTTPException(404, f"run {run_id} not found")
        return found[0]

    @app.get("/api/v1/runs/{run_id}/scores")
    async def get_run_scores(request: Request, run_id: str) -> dict[str, Any]:
        _check_run_id(run_id)
        return {"scores": await asyncio.to_thread(need_store().run_scores, run_id, project=project_of(request))}

    @app.get("/api/v1/policies/stats")
    async def policy_stats(
        request: Request,
        window: str = Query("5m", max_length=100),
        policy: str | None = Query(None, max_length=MAX_FILTER),
        baseline: str | None = Query(None, max_length=200),
        margin: float = Query(0.0, ge=0, le=1e12),
        worse: str = Query("lower", max_length=10),
    ) -> dict[str, Any]:
        """Scored scores since `window` ago per policy, evaluator and name with their intervals; with `baseline`
        (the period before, e.g. `7d`, or `run:<run id>`) each one's difference with it (Newcombe or Welch); the
        calibration of judges people gave feedback on (kappa, sensitivity, specificity, prediction-powered rate)."""
        try:
            seconds = parse_duration(window)
        except ValueError as e:
            raise HTTPException(400, f"window: {e}") from None
        if seconds <= 0:
            raise HTTPException(400, "window: must be longer than 0s")
        if seconds > score_api.MAX_WINDOW_S:
            raise HTTPException(400, f"window: at most {score_api.MAX_WINDOW_S // 3600:g}h (ten years)")
        since_ns = time.time_ns() - int(seconds * 1e9)
        try:
            score_api.check_comparison(baseline, margin, worse)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        return await asyncio.to_thread(
            score_api.policy_stats, need_store(), window=window, since_ns=since_ns, policy=policy,
            project=project_of(request), baseline=baseline, margin=margin, worse=worse,
        )  # fmt: skip

    def need_datasets() -> DatasetStore:
        found = need_store()
        if not isinstance(found, DatasetStore):
            raise HTTPException(404, "this collector's store keeps no datasets")
        return found

    @app.get("/api/v1/datasets")
    async def list_datasets(request: Request) -> dict[str, Any]:
        """The datasets policies promoted into the store (`promote_to: store`), each with its row count."""
        lister = need_datasets().list_datasets
        return {"datasets": await asyncio.to_thread(lister, project=project_of(request))}

    @app.get("/api/v1/datasets/{dataset:path}/rows")
    async def dataset_rows(
        request: Request, dataset: str, limit: int = Query(100_000, ge=1, le=1_000_000)
    ) -> dict[str, Any]:
        """A promoted dataset's rows, as the harness reads them, in promotion order."""
        if len(dataset) > MAX_FILTER:
            raise HTTPException(400, f"dataset: at most {MAX_FILTER} characters")
        rows_of = need_datasets().dataset_rows
        rows = await asyncio.to_thread(rows_of, dataset, limit=limit, project=project_of(request))
        if not rows:
            raise HTTPException(404, f"dataset {dataset} has no rows")
        return {"dataset": dataset, "rows": rows}

    @app.get("/api/v1/alerts")
    async def list_alerts(
        request: Request,
        policy: str | None = Query(None, max_length=MAX_FILTER),
        since: str | None = Query(None, max_length=100),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        """Policy alerts that fired or resolved since `since` (a duration back from now or an ISO-8601 time; none:
        ever), newest first."""
        try:
            since_ns = query.alerts_since_ns(since)
        except ValueError as e:
            raise HTTPException(400, f"since: {e}") from None
        lister = getattr(need_store(), "list_alerts", None)
        if lister is None:
            raise HTTPException(404, "this collector's store keeps no alerts")
        project = project_of(request)
        found = await asyncio.to_thread(lister, limit=limit, policy=policy, since_ns=since_ns, project=project)
        return {"alerts": found}

    return app


def _on_own_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """`fn(*args)` on a daemon thread of its own: unlike an executor's threads, one that never returns neither
    holds a pool other requests wait on nor keeps the process from exiting on SIGTERM."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def work() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the awaiting request
            error = e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed (shutdown) while it ran: nobody waits for it
            pass

    threading.Thread(target=work, name="evalsi-evaluate", daemon=True).start()
    return future


MAX_FILTER = 1000
"""The longest service or policy name a query filters on: a longer one is refused, not sent to the store."""
MAX_WHERE = 4000
"""The longest CEL condition a trace search takes."""


MAX_STORED_SPANS_TRACES = 1_000  # trace ids in one POST /api/v1/spans/stored


def _body_limits(app: FastAPI, config: ApiConfig) -> Callable[[Scope], BodyLimit]:
    """The body limit of the route a request goes to: the bulk one on `BULK_ROUTES` (never below the other)."""
    usual = BodyLimit(config.max_request_body_size, "service.api.max_request_body_size")
    bulk = BodyLimit(
        max(config.max_bulk_request_body_size, config.max_request_body_size), "service.api.max_bulk_request_body_size"
    )

    def limit_of(scope: Scope) -> BodyLimit:
        for route in app.router.routes:
            if getattr(route, "path", None) in BULK_ROUTES and route.matches(scope)[0] is Match.FULL:
                return bulk
        return usual

    return limit_of


def _check_trace_id(name: str, value: str) -> None:
    if not is_trace_id(value):
        raise HTTPException(400, f"{name}: invalid trace id {value[:80]!r}: expected 32 hex digits")


def _check_run_id(run_id: str) -> None:
    if not run_api.RUN_ID.fullmatch(run_id):
        raise HTTPException(400, f"run_id: invalid run id {run_id[:80]!r}: 1 to 200 letters, digits, '.', '_' or '-'")
