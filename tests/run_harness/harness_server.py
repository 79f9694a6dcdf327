"""An agent serving the agent harness HTTP contract v1, for tests: a real HTTP server on port 0 in a thread, checking
`x-api-key`, whose runs behave as their question says (`polls:3`, `atif`, `flaky:2`, `hang`, `fail`, `malformed`)."""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BASE_PATH = "/evalkit/v1"
T0 = "2025-10-16T14:30:00"
"""The ATIF documents' times are T0 plus a few seconds, in UTC."""


def at(seconds: float) -> str:
    """An ISO 8601 time `seconds` after T0 (UTC)."""
    whole, frac = divmod(round(seconds * 1000), 1000)
    return f"2025-10-16T14:30:{whole:02d}.{frac:03d}Z"


def question_of(value: Any) -> str:
    if isinstance(value, dict) and isinstance(value.get("question"), str):
        return value["question"]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _number(question: str, prefix: str) -> int:
    """N of a `prefix:N` question (0 when it is not one)."""
    head, _, tail = question.partition(":")
    return int(tail.split()[0]) if head == prefix and tail.strip() else 0


def atif_document(question: str, run_id: str) -> dict[str, Any]:
    """A run with a system prompt, two model turns, three tool calls (one failing, one delegating to a subagent with
    its own model turns and tool call) and per-step metrics."""
    researcher = {
        "schema_version": "ATIF-v1.7",
        "trajectory_id": "sub-1",
        "agent": {"name": "researcher", "version": "0.3.0"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "Find the population of Paris.", "timestamp": at(1.1)},
            {
                "step_id": 2,
                "source": "agent",
                "model_name": "small-model",
                "message": "",
                "timestamp": at(1.5),
                "tool_calls": [
                    {"tool_call_id": "s1", "function_name": "web_search", "arguments": {"q": "population of Paris"}}
                ],
                "observation": {
                    "results": [{"source_call_id": "s1", "content": "2.1 million", "extra": {"timestamp": at(1.9)}}]
                },
                "metrics": {"prompt_tokens": 50, "completion_tokens": 5, "cost_usd": 0.0001},
            },
            {
                "step_id": 3,
                "source": "agent",
                "model_name": "small-model",
                "message": "Paris has 2.1 million people.",
                "timestamp": at(2.2),
                "metrics": {"prompt_tokens": 70, "completion_tokens": 8, "cost_usd": 0.0002},
            },
        ],
    }
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": run_id,
        "agent": {"name": "test-agent", "version": "1.2.0", "model_name": "big-model"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are a careful assistant.", "timestamp": at(0)},
            {"step_id": 2, "source": "user", "message": question, "timestamp": at(0)},
            {
                "step_id": 3,
                "source": "agent",
                "message": "Let me compute and look it up.",
                "reasoning_content": "I need 6*7 and a population.",
                "timestamp": at(1),
                "tool_calls": [
                    {"tool_call_id": "c1", "function_name": "calculator", "arguments": {"expression": "6*7"}},
                    {"tool_call_id": "c2", "function_name": "delegate", "arguments": {"task": "population of Paris"}},
                    {"tool_call_id": "c3", "function_name": "lookup", "arguments": {"key": "zzz"}},
                ],
                "observation": {
                    "results": [
                        {"source_call_id": "c1", "content": "42", "extra": {"timestamp": at(1.25)}},
                        {
                            "source_call_id": "c2",
                            "content": [{"type": "text", "text": "Paris has 2.1 million people."}],
                            "subagent_trajectory_ref": [{"trajectory_id": "sub-1"}],
                            "extra": {"timestamp": at(2.5)},
                        },
                        {
                            "source_call_id": "c3",
                            "content": "no such key",
                            "extra": {"is_error": True, "error_type": "KeyError", "timestamp": at(1.1)},
                        },
                    ]
                },
                "metrics": {"prompt_tokens": 120, "cached_tokens": 100, "completion_tokens": 30, "cost_usd": 0.002},
            },
            {
                "step_id": 4,
                "source": "agent",
                "model_name": "big-model-2",
                "message": "The answer is 42.",
                "timestamp": at(3),
                "metrics": {"prompt_tokens": 200, "completion_tokens": 10, "cost_usd": 0.001},
            },
        ],
        "final_metrics": {"total_prompt_tokens": 440, "total_completion_tokens": 53, "total_cost_usd": 0.0033},
        "subagent_trajectories": [researcher],
    }


def simple_document(question: str, answer: str) -> dict[str, Any]:
    return {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "test-agent", "version": "1.2.0"},
        "steps": [
            {"step_id": 1, "source": "user", "message": question},
            {
                "step_id": 2,
                "source": "agent",
                "model_name": "big-model",
                "message": answer,
                "metrics": {"prompt_tokens": 10, "completion_tokens": 2},
            },
        ],
    }


def malformed_document(question: str) -> dict[str, Any]:
    """A result at steps[2].observation.results[0] whose source_call_id names no tool call."""
    return {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "test-agent"},
        "steps": [
            {"step_id": 1, "source": "user", "message": question},
            {
                "step_id": 2,
                "source": "agent",
                "message": "",
                "tool_calls": [{"tool_call_id": "c1", "function_name": "calculator", "arguments": {}}],
                "observation": {"results": [{"source_call_id": "c1", "content": "1"}]},
            },
            {
                "step_id": 3,
                "source": "agent",
                "message": "",
                "tool_calls": [{"tool_call_id": "c2", "function_name": "calculator", "arguments": {}}],
                "observation": {"results": [{"source_call_id": "c9", "content": "2"}]},
            },
        ],
    }


@dataclass
class Run:
    run_id: str
    question: str
    polls: int = 0
    stopped: bool = False
    reported_terminal: bool = False
    poll_failures: int = 0


@dataclass
class Capabilities:
    """What the server says of itself; `raw` replaces the whole answer (e.g. with non-JSON text)."""

    input_schema: Any = None
    stop: bool = True
    model_override: bool = False
    max_concurrent_runs: int | None = None
    trajectory: bool = True
    contract_version: Any = "1.0"
    raw: bytes | None = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "contract_version": self.contract_version,
            "agent": {"name": "test-agent", "version": "1.2.0"},
            "provides": {"trajectory": self.trajectory, "tool_calls": True, "token_usage": True},
            "accepts": {"files": False, "file_urls": False, "model_override": self.model_override, "stop": self.stop},
            "limits": {"max_concurrent_runs": self.max_concurrent_runs},
        }
        if self.input_schema is not None:
            doc["input_schema"] = self.input_schema
        return doc


@dataclass
class HarnessServer:
    """The agent. Runs behave by their question: `polls:N` is queued/running for N polls, then completes (any other
    question completes at the first poll); `atif` completes with `atif_document`; `flaky:N` answers 503 to its first
    N POSTs, `poll503:N` to its first N polls; `hang` never finishes (a `stop` makes it `cancelled`); `fail` ends
    `failed`; `malformed` completes with `malformed_document`; `output` completes with a JSON `output`, no `answer`."""

    key: str = "test-key"
    capabilities: Capabilities = field(default_factory=Capabilities)
    runs: dict[str, Run] = field(default_factory=dict)
    posts: list[dict[str, Any]] = field(default_factory=list)
    """The bodies of the POST /runs that started a run."""
    post_headers: list[dict[str, str]] = field(default_factory=list)
    post_failures: dict[str, int] = field(default_factory=dict)
    """The 503s answered to POST /runs, by question."""
    stops: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    """Runs started and not yet reported terminal: now, and at most (what `max_concurrent_runs` should bound)."""

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._http is not None, "start() first"
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}{BASE_PATH}"

    def start(self) -> HarnessServer:
        harness = self

        class Handler(_Handler):
            server_harness = harness

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> HarnessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the contract, one method per call: (status, JSON body)

    def create(self, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        if not isinstance(body, dict) or "input" not in body:
            return 422, {"detail": "body must be {input, metadata?, model?}"}
        question = question_of(body["input"])
        with self.lock:
            failed = self.post_failures.get(question, 0)
            if failed < _number(question, "flaky"):
                self.post_failures[question] = failed + 1
                return 503, {"detail": "overloaded, try again"}
            run_id = f"run-{next(self._ids)}"
            self.runs[run_id] = Run(run_id, question)
            self.posts.append(body)
            self.post_headers.append(headers)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        return 201, {"run_id": run_id}

    def status(self, run: Run) -> tuple[int, Any]:
        with self.lock:
            if run.poll_failures < _number(run.question, "poll503"):
                run.poll_failures += 1
                return 503, {"detail": "busy"}
            run.polls += 1
            doc = self._status(run)
            if doc["status"] in ("completed", "failed", "cancelled") and not run.reported_terminal:
                run.reported_terminal = True
                self.active -= 1
        return 200, doc

    def _status(self, run: Run) -> dict[str, Any]:
        q = run.question
        if q.startswith("hang"):
            return {"run_id": run.run_id, "status": "cancelled" if run.stopped else "running"}
        if run.polls <= _number(q, "polls"):
            return {"run_id": run.run_id, "status": "queued" if run.polls == 1 else "running"}
        if q == "fail":
            return {"run_id": run.run_id, "status": "failed", "error": "the tool backend is down"}
        if q == "output":
            return {"run_id": run.run_id, "status": "completed", "output": {"total": 3, "items": ["a", "b", "c"]}}
        answer = "The answer is 42." if q == "atif" else f"answer to {q}"
        return {"run_id": run.run_id, "status": "completed", "answer": answer}

    def stop(self, run: Run) -> tuple[int, Any]:
        with self.lock:
            run.stopped = True
            self.stops.append(run.run_id)
        return 202, {"run_id": run.run_id, "status": "stopping"}

    def trajectory(self, run: Run) -> tuple[int, Any]:
        if run.question == "atif":
            return 200, atif_document(run.question, run.run_id)
        if run.question == "malformed":
            return 200, malformed_document(run.question)
        return 200, simple_document(run.question, f"answer to {run.question}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: without this each answer waits 40 ms
    server_harness: HarnessServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read what the harness recorded
        return None

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        h = self.server_harness
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        with h.lock:
            h.requests.append((method, path))
        if self.headers.get("x-api-key") != h.key:
            return self._send(401, {"detail": "missing or wrong x-api-key"})
        if not path.startswith(BASE_PATH + "/"):
            return self._send(404, {"detail": "not found"})
        parts = path.removeprefix(BASE_PATH + "/").split("/")
        if method == "GET" and parts == ["capabilities"]:
            if h.capabilities.raw is not None:
                return self._send_bytes(200, h.capabilities.raw, "text/html")
            return self._send(200, h.capabilities.document())
        if method == "POST" and parts == ["runs"]:
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                return self._send(400, {"detail": "not JSON"})
            headers = {k.lower(): v for k, v in self.headers.items()}
            return self._send(*h.create(body, headers))
        if parts[0] != "runs" or len(parts) not in (2, 3):
            return self._send(404, {"detail": "not found"})
        run = h.runs.get(parts[1])
        if run is None:
            return self._send(404, {"detail": f"no run {parts[1]!r}"})
        if method == "GET" and len(parts) == 2:
            return self._send(*h.status(run))
        if method == "POST" and parts[2:] == ["stop"]:
            return self._send(*h.stop(run))
        if method == "GET" and parts[2:] == ["trajectory"]:
            return self._send(*h.trajectory(run))
        return self._send(404, {"detail": "not found"})

    def _send(self, status: int, body: Any) -> None:
        self._send_bytes(status, json.dumps(body).encode(), "application/json")

    def _send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
