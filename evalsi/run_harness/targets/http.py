"""The `http` target: an agent behind the agent harness HTTP contract v1 (capabilities, `POST /runs`, polling, `stop`
on timeout, the run's ATIF trajectory read into steps)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from evalsi.evaluators.schema import compiled, json_type, violations
from evalsi.run_harness.atif import AtifError, Trajectory, convert
from evalsi.run_harness.model import Attempt, Task
from evalsi.run_harness.spec import HttpTarget
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError
from evalsi.runtime.backoff import Backoff, retry_after

log = logging.getLogger("evalsi.run")

DEFAULT_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["question"],
    "properties": {"question": {"type": "string"}},
}
"""The contract's input when an agent declares no `input_schema`."""

REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
RETRIES = 3
"""Retries of a request answered 429/5xx or lost on the way (so 4 tries), with `evalsi.runtime.backoff.Backoff`
waits."""
STOP_ON_CANCEL_S = 2.0
"""How long a cancelled attempt spends telling the agent to stop its run."""
BODY_SHOWN = 300

TERMINAL = ("completed", "failed", "cancelled")
STATUSES = ("queued", "running", *TERMINAL)
_CONTRACT = re.compile(r"1(\.\d+)*")
_HINT_URL = "is target.http.url the agent's harness base URL (by convention ending in /evalkit/v1)?"


@dataclass(frozen=True)
class Capabilities:
    """What `GET /capabilities` said, as far as evalsi uses it."""

    contract_version: str
    agent_name: str
    input_schema: Any
    default_schema: bool
    """No `input_schema` was given: the contract's `{"question": string}`."""
    trajectory: bool = False
    model_override: bool = False
    stop: bool = False
    max_concurrent_runs: int | None = None


def resolve_api_key(value: str | None) -> str | None:
    """The key to send: `env:VAR` read from the environment (TargetError naming VAR when unset), else as written."""
    if value is None or not value.startswith("env:"):
        return value
    name = value.removeprefix("env:")
    key = os.environ.get(name)
    if not key:
        raise TargetError(
            f"target.http.api_key: the environment variable {name} is not set (or empty); export it with the "
            "agent's key"
        )
    return key


class HttpAgent:
    """An agent behind the harness contract. `prepare` reads the capabilities and checks every task's input against
    the agent's input schema before anything runs; `attempt` starts a run, polls it to a terminal status (sending
    `stop` on timeout when the agent accepts it) and reads its trajectory. At most `limits.max_concurrent_runs`
    attempts run at once; the wait for a slot counts neither against the timeout nor in the attempt's time.

    Inputs are sent as written, with one exception: when the agent declares no `input_schema` (so the contract's
    default `{"question": string}` applies), a string input is sent as `{"question": input}`."""

    def __init__(self, config: HttpTarget, *, retries: int = RETRIES, backoff: Callable[[], Backoff] = Backoff) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        self.identity = f"http:{config.url}"
        self.grace_s = config.stop_grace  # after `stop` on a timeout, the runner waits this long for a final status
        self.retries = retries
        self.backoff = backoff
        self.capabilities: Capabilities | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def max_concurrent_runs(self) -> int | None:
        """The agent's limit on simultaneous runs (after `prepare`), None when it gives none."""
        return self.capabilities.max_concurrent_runs if self.capabilities else None

    async def prepare(self, tasks: list[Task]) -> None:
        key = resolve_api_key(self.config.api_key)
        await self.close()
        self._client = httpx.AsyncClient(
            base_url=self.url, headers={"x-api-key": key} if key else {}, timeout=REQUEST_TIMEOUT
        )
        try:
            caps = await self._read_capabilities(self._client, key is not None)
            problems = self._check_inputs(tasks, caps)
        except BaseException:
            await self.close()
            raise
        if problems:
            await self.close()
            raise TargetError("\n".join(problems))
        if self.config.model and not caps.model_override:
            log.warning(
                "target.http.model is %r but the agent does not accept a model override (accepts.model_override); "
                "its runs use the agent's own model",
                self.config.model,
            )
        self.capabilities = caps
        self._slots = asyncio.Semaphore(caps.max_concurrent_runs) if caps.max_concurrent_runs else None

    def payload(self, task: Task) -> Any:
        """The `input` sent for a task (see the class docstring); after `prepare`."""
        if self.capabilities is None:
            raise RuntimeError("HttpAgent.payload before prepare")
        return _payload(task, self.capabilities)

    async def _read_capabilities(self, client: httpx.AsyncClient, has_key: bool) -> Capabilities:
        where = f"GET {self.url}/capabilities"
        try:
            resp = await client.get("/capabilities")
        except httpx.HTTPError as e:
            raise TargetError(
                f"cannot reach the agent: {where}: {_reason(e)}; check target.http.url and that the agent is running"
            ) from None
        if resp.status_code in (401, 403):
            raise TargetError(
                f"{where} answered {resp.status_code}: the agent refused the api key; set target.http.api_key (sent "
                "as x-api-key) to the agent's key" + ("" if has_key else " (none is set)")
            )
        if resp.status_code != 200:
            raise TargetError(f"{where} answered {resp.status_code}: {_body(resp)}; {_HINT_URL}")
        try:
            caps = resp.json()
        except ValueError:
            kind = resp.headers.get("content-type", "no content type")
            raise TargetError(f"{where} did not answer JSON ({kind}: {_body(resp)}); {_HINT_URL}") from None
        if not isinstance(caps, dict):
            raise TargetError(f"{where} answered a JSON {json_type(caps)}, not the capabilities object; {_HINT_URL}")
        version = caps.get("contract_version")
        if version is None:
            raise TargetError(f"{where}: no contract_version; evalsi speaks the agent harness contract 1 (1.x)")
        if isinstance(version, bool) or not isinstance(version, str | int) or not _CONTRACT.fullmatch(str(version)):
            raise TargetError(
                f"{where}: contract_version is {version!r}; evalsi speaks the agent harness contract 1 (1.x)"
            )
        provides, accepts, limits = (_section(caps, name, where) for name in ("provides", "accepts", "limits"))
        most = limits.get("max_concurrent_runs")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise TargetError(f"{where}: limits.max_concurrent_runs is {most!r}; expected an integer >= 1")
        agent = caps.get("agent")
        name = agent.get("name") if isinstance(agent, dict) else agent
        schema = caps.get("input_schema")
        return Capabilities(
            contract_version=str(version),
            agent_name=name if isinstance(name, str) else "",
            input_schema=DEFAULT_INPUT_SCHEMA if schema is None else schema,
            default_schema=schema is None,
            trajectory=provides.get("trajectory") is True,
            model_override=accepts.get("model_override") is True,
            stop=accepts.get("stop") is True,
            max_concurrent_runs=most,
        )

    def _check_inputs(self, tasks: list[Task], caps: Capabilities) -> list[str]:
        """Every violation of the input schema, one line each, under a heading; empty when all records pass."""
        where = f"GET {self.url}/capabilities: input_schema"
        try:
            validator = compiled(caps.input_schema)
        except ValueError as e:
            raise TargetError(f"{where} is {e}") from None
        lines: list[str] = []
        failing = 0
        for task in tasks:
            try:
                found = violations(validator, _payload(task, caps))
            except ValueError as e:
                raise TargetError(f"{where}: {e}") from None
            failing += bool(found)
            at = f"dataset line {task.line}, task {task.id!r}" if task.line else f"task {task.id!r}"
            lines += [f"  {at}: {path}: {what}" for path, what in found]
        if not lines:
            return []
        schema = (
            'none declared, so the default {"question": string}; a string input is sent as {"question": ...}'
            if caps.default_schema
            else "from GET /capabilities"
        )
        heading = (
            f"{failing} of {len(tasks)} records do not match the agent's input schema ({schema}); nothing ran. "
            "Fix these records or the agent's schema:"
        )
        return [heading, *lines]

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        if self._client is None or self.capabilities is None:
            raise RuntimeError("HttpAgent.attempt before prepare")
        client, caps = self._client, self.capabilities
        async with self._slot():
            attempt = Attempt(task, ctx.trial)
            started = time.monotonic()
            run_id = await self._start(client, caps, task, ctx)
            path = f"/runs/{quote(run_id, safe='')}"
            try:
                status = await self._wait(client, caps, path, run_id, started + ctx.timeout_s, ctx.timeout_s)
            except asyncio.CancelledError:
                if caps.stop:  # the runner gave up on the attempt: do not leave the run going on the agent
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.post(f"{path}/stop"), STOP_ON_CANCEL_S)
                raise
            attempt.end_ns = time.time_ns()
            self._read_answer(attempt, status, run_id)
            if caps.trajectory:
                trajectory = await self._trajectory(client, path, attempt.start_ns)
                attempt.steps = trajectory.steps
                attempt.agent_name = trajectory.agent_name
            attempt.agent_name = attempt.agent_name or caps.agent_name
            return attempt

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            yield
        else:
            async with self._slots:
                yield

    async def _start(self, client: httpx.AsyncClient, caps: Capabilities, task: Task, ctx: AttemptContext) -> str:
        body: dict[str, Any] = {
            "input": _payload(task, caps),
            "metadata": {"experiment_id": ctx.run_id, "case_id": task.id, "repetition": ctx.trial},
        }
        if self.config.model and caps.model_override:
            body["model"] = self.config.model
        # an instrumented agent may join the attempt's trace; the contract does not need it
        headers = {"traceparent": ctx.traceparent} if ctx.traceparent else {}
        resp = await self._request(client, "POST", "/runs", json=body, headers=headers)
        if resp.status_code not in (200, 201, 202):
            raise AttemptFailed("target_error", f"POST /runs answered {resp.status_code}: {_body(resp)}")
        data = _object(resp, "POST /runs")
        run_id = data.get("run_id")
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            run_id = str(run_id)
        if not isinstance(run_id, str) or not run_id:
            raise AttemptFailed("malformed", f"POST /runs answered {resp.status_code} without a run_id: {_body(resp)}")
        return run_id

    async def _wait(
        self, client: httpx.AsyncClient, caps: Capabilities, path: str, run_id: str, deadline: float, timeout_s: float
    ) -> dict[str, Any]:
        """The run's terminal status; AttemptFailed("timeout") when it has none by `deadline` (after `stop` and up to
        `stop_grace` of polling when the agent accepts stop)."""
        interval = self.config.poll_interval
        while True:
            status = await self._status(client, path)
            if status["status"] in TERMINAL:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(interval, left))
        late = f"run {run_id} had no terminal status after {timeout_s:g}s (it was {status['status']!r})"
        if not caps.stop:
            raise AttemptFailed(
                "timeout", f"{late}; the agent does not accept stop (accepts.stop), so the run may still be going"
            )
        try:
            resp = await self._request(client, "POST", f"{path}/stop")
        except AttemptFailed as e:
            raise AttemptFailed("timeout", f"{late}; stop failed: {e}") from None
        if resp.status_code >= 400:
            raise AttemptFailed("timeout", f"{late}; POST {path}/stop answered {resp.status_code}: {_body(resp)}")
        grace_end = time.monotonic() + self.config.stop_grace
        while (left := grace_end - time.monotonic()) > 0:
            await asyncio.sleep(min(interval, left))
            try:
                status = await self._status(client, path)
            except AttemptFailed as e:
                raise AttemptFailed("timeout", f"{late}; sent stop, then: {e}") from None
            if status["status"] in TERMINAL:
                raise AttemptFailed("timeout", f"{late}; sent stop, and the run ended {status['status']!r}")
        raise AttemptFailed(
            "timeout",
            f"{late}; sent stop, and it was still {status['status']!r} {self.config.stop_grace:g}s later (stop_grace)",
        )

    async def _status(self, client: httpx.AsyncClient, path: str) -> dict[str, Any]:
        resp = await self._request(client, "GET", path)
        if resp.status_code != 200:
            raise AttemptFailed("target_error", f"GET {path} answered {resp.status_code}: {_body(resp)}")
        data = _object(resp, f"GET {path}")
        if data.get("status") not in STATUSES:
            raise AttemptFailed(
                "malformed", f"GET {path}: status is {data.get('status')!r}, not one of {', '.join(STATUSES)}"
            )
        return data

    def _read_answer(self, attempt: Attempt, status: dict[str, Any], run_id: str) -> None:
        if status["status"] == "failed":
            raise AttemptFailed("target_error", f"run {run_id} failed: {_error(status.get('error'))}")
        if status["status"] == "cancelled":
            raise AttemptFailed("target_error", f"the agent cancelled run {run_id}: {_error(status.get('error'))}")
        answer, output = status.get("answer"), status.get("output")
        if answer is not None and not isinstance(answer, str):
            raise AttemptFailed("malformed", f"run {run_id} completed with an answer that is a {json_type(answer)}")
        if output is not None and not isinstance(output, dict):
            raise AttemptFailed("malformed", f"run {run_id} completed with an output that is a {json_type(output)}")
        if answer is None and output is None:
            raise AttemptFailed("malformed", f"run {run_id} completed with neither answer nor output")
        attempt.output, attempt.output_json = answer, output

    async def _trajectory(self, client: httpx.AsyncClient, path: str, start_ns: int) -> Trajectory:
        where = f"GET {path}/trajectory"
        resp = await self._request(client, "GET", f"{path}/trajectory")
        if resp.status_code != 200:
            raise AttemptFailed("target_error", f"{where} answered {resp.status_code}: {_body(resp)}")
        try:
            doc = resp.json()
        except ValueError:
            raise AttemptFailed("malformed", f"{where}: not JSON: {_body(resp)}") from None
        try:
            return convert(doc, start_ns)
        except AtifError as e:
            raise AttemptFailed("malformed", f"{where}: {e}") from None

    async def _request(self, client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to a request, after retrying 429s, 5xx and lost connections (`retries` times); AttemptFailed
        ("target_error") naming the last failure when every try failed."""
        backoff = self.backoff()
        for tries in range(1, self.retries + 2):
            wait_hint: float | None = None
            try:
                resp = await client.request(method, path, **kwargs)
            except httpx.TransportError as e:
                failure = f"{method} {path} failed: {_reason(e)}"
            else:
                if resp.status_code != 429 and resp.status_code < 500:
                    return resp
                failure = f"{method} {path} answered {resp.status_code}: {_body(resp)}"
                wait_hint = retry_after(resp.headers.get("retry-after"))
            if tries > self.retries:
                break
            await asyncio.sleep(backoff.next_wait(wait_hint))
        raise AttemptFailed("target_error", f"{failure} ({tries} tries)")


def _payload(task: Task, caps: Capabilities) -> Any:
    if caps.default_schema and isinstance(task.input, str):
        return {"question": task.input}
    return task.input


def _section(caps: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = caps.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TargetError(f"{where}: {name} is a {json_type(value)}, expected an object of flags")
    return value


def _object(resp: httpx.Response, where: str) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        raise AttemptFailed("malformed", f"{where} did not answer JSON: {_body(resp)}") from None
    if not isinstance(data, dict):
        raise AttemptFailed("malformed", f"{where} answered a JSON {json_type(data)}, expected an object")
    return data


def _error(value: Any) -> str:
    if value is None:
        return "no error given"
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        return value["message"]
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _body(resp: httpx.Response) -> str:
    text = resp.text.strip().replace("\n", " ")
    if not text:
        return "(empty body)"
    return text if len(text) <= BODY_SHOWN else text[: BODY_SHOWN - 1] + "…"


def _reason(e: httpx.HTTPError) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
