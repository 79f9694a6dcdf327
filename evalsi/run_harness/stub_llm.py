"""A small OpenAI-compatible Chat Completions server for the quickstart, the tests and the benchmarks: no network, no
model, the same answer for the same request.

`POST /v1/chat/completions` (and `/chat/completions`) answers from a few rules on the last user message:

- it asks about the weather in a city (or several: "in Paris and Tokyo") and the request offers a `get_weather`
  tool: first a reply calling `get_weather({"city": ...})` once per city (parallel tool calls), then, once the tool
  results follow, a sentence using them ("The weather in Paris is sunny, 18°C."; an `{"error": ...}` result gives
  "I could not get the weather in Paris: ...");
- it holds arithmetic ("What is 2 + 3?"): the number ("5");
- anything else: "I don't know."

Asked with the harness's simulated-user prompt (`You play a user ...`), it plays the user: the goal's text first,
then the stop marker. A model whose name holds `retry-tools` calls a `get_weather` that failed again, up to
twice, before answering.

`usage` counts about 1.3 tokens a word. Faults are injected by the `x-stub-fault` header or by the model's name
(each pattern is searched for anywhere in it, so `stub-slow-50ms-fail-503-twice` has two):

- `fail-<status>-<once|twice|thrice|N|always>`: that status N times for each distinct request (same model and
  messages), then the answer (and the count starts again, so every trial of a task sees the same faults);
- `retry-after-<seconds>`: failures carry that `Retry-After`;
- `slow-<N>ms` / `slow-<N>s`: sleep before answering;
- `malformed`: a 200 whose JSON is no Chat Completions; `not-json`: a 200 in plain text;
- `bad-request`: a 400 with an OpenAI-style error body.

Run it with `python -m evalsi.run_harness.stub_llm --port 0` (prints `listening on http://127.0.0.1:PORT/v1`), or in
a test with `with StubLLM() as llm: ... llm.base_url`. It is a `ThreadingHTTPServer` speaking HTTP/1.1 with
keep-alive: a thread per connection, not per request.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import operator
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
UNKNOWN_ANSWER = "I don't know."
WEATHER_TOOL = "get_weather"
TOKENS_PER_WORD = 1.3

_WEATHER = re.compile(r"\bweather\s+(?:like\s+)?in\s+(.+?)\s*(?:[?.!]|$)", re.IGNORECASE)
_WHEN = re.compile(r"\s+(?:today|tomorrow|tonight|now|right now|currently|this \w+)$", re.IGNORECASE)
_CITY_SPLIT = re.compile(r"\s*,\s*(?:and\s+)?|\s+and\s+", re.IGNORECASE)
_EXPRESSION = re.compile(r"[-+(]*\s*\d[\d.\s()+\-*/\u00d7\u00f7^]*")
_OPERATOR = re.compile(r"\d\s*[-+*/\u00d7\u00f7^]\s*[-(]*\s*\d")
_WORD = re.compile(r"\S+")
_TIMES = {"once": 1, "twice": 2, "thrice": 3, "always": -1}
_FAIL = re.compile(r"fail-(\d{3})(?:-(once|twice|thrice|always|\d+))?")
_SLOW = re.compile(r"slow-(\d+(?:\.\d+)?)(ms|s)\b")
_USER_GOAL = re.compile(r"Your goal[^\n]*:\n(.+?)\n\n", re.S)
_USER_STOP = re.compile(r"reply with (\S+) alone")
_RETRY_AFTER = re.compile(r"retry-after-(\d+(?:\.\d+)?)")
_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


# --- the rules ----------------------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(_WORD.findall(text)) * TOKENS_PER_WORD))


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.10g}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError("not arithmetic")


def arithmetic(text: str) -> str | None:
    """The value of the first arithmetic expression in the text ("What is 2 + 3?" → "5"), None when it has none."""
    for match in _EXPRESSION.finditer(text):
        expr = match.group().strip()
        if not _OPERATOR.search(expr):
            continue
        expr = expr.replace("\u00d7", "*").replace("\u00f7", "/").replace("^", "**")
        try:
            return _number(_evaluate(ast.parse(expr, mode="eval")))
        except ZeroDivisionError:
            return "undefined"
        except (SyntaxError, ValueError, OverflowError, TypeError):
            continue
    return None


def weather_cities(text: str) -> list[str]:
    """The cities a message asks the weather of ("What's the weather in Paris and Tokyo?" → Paris, Tokyo)."""
    match = _WEATHER.search(text)
    if not match:
        return []
    place = _WHEN.sub("", match.group(1).strip())
    return [c.strip() for c in _CITY_SPLIT.split(place) if c.strip()]


def _render(content: str) -> tuple[bool, str]:
    """A tool result as words: (is it an error, the words)."""
    try:
        value = json.loads(content)
    except ValueError:
        return False, content.strip()
    if isinstance(value, dict) and "error" in value:
        return True, str(value["error"])
    if isinstance(value, dict):
        return False, ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return False, ", ".join(str(v) for v in value)
    return False, str(value)


def _tool_names(tools: Any) -> set[str]:
    names = set()
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _weather_call(digest: str, i: int, city: str) -> dict[str, Any]:
    return {
        "id": f"call_{hashlib.sha1(f'{digest}:{i}'.encode()).hexdigest()[:16]}",
        "type": "function",
        "function": {"name": WEATHER_TOOL, "arguments": json.dumps({"city": city})},
    }


def _weather_reply(
    messages: list[Any], last_user: int, cities: list[str], digest: str, retries: int = 0
) -> dict[str, Any]:
    calls: dict[str, str] = {}  # tool call id -> city
    results: dict[str, str] = {}  # tool call id -> content
    for m in messages[last_user + 1 :]:
        if not isinstance(m, dict):
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and fn.get("name") == WEATHER_TOOL:
                args = fn.get("arguments")
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    args = {}
                calls[str(call.get("id"))] = str(args.get("city", "")) if isinstance(args, dict) else ""
        if m.get("role") == "tool":
            results[str(m.get("tool_call_id"))] = text_of(m.get("content"))
    answered = [(calls[i], results[i]) for i in calls if i in results]
    if not answered:
        tool_calls = [_weather_call(digest, i, city) for i, city in enumerate(cities)]
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}
    latest = dict(answered)  # each city's last result
    tries = {city: sum(1 for c in calls.values() if c == city) for city in latest}
    again = [c for c, content in latest.items() if _render(content)[0] and tries[c] <= retries]
    if again:  # `retry-tools` in the model's name: call a failed tool again
        return {"role": "assistant", "content": None,
                "tool_calls": [_weather_call(digest, i, city) for i, city in enumerate(again)]}  # fmt: skip
    sentences = []
    for city, content in latest.items():
        error, words = _render(content)
        if error:
            sentences.append(f"I could not get the weather in {city}: {words}.")
        else:
            sentences.append(f"The weather in {city} is {words.rstrip('.')}.")
    return {"role": "assistant", "content": " ".join(sentences)}


def _simulated_user(messages: list[Any]) -> dict[str, Any] | None:
    """Playing the harness's simulated user (its system prompt): the goal as the first message, then the stop
    marker."""
    system = messages[0] if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else {}
    prompt = text_of(system.get("content"))
    if "You play a user" not in prompt:
        return None
    goal = _USER_GOAL.search(prompt)
    stop = _USER_STOP.search(prompt)
    said = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    if said == 0 and goal:
        return {"role": "assistant", "content": goal.group(1).strip()}
    return {"role": "assistant", "content": stop.group(1) if stop else "###STOP###"}


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions answer to a request body (no faults): the rules above, deterministic."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    model = body.get("model") if isinstance(body.get("model"), str) else "stub"
    digest = hashlib.sha1(json.dumps([model, messages], sort_keys=True, default=str).encode()).hexdigest()
    as_user = _simulated_user(messages)
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1)
    question = text_of(messages[last_user].get("content")) if last_user >= 0 else ""
    cities = weather_cities(question)
    if as_user is not None:
        message = as_user
    elif cities and WEATHER_TOOL in _tool_names(body.get("tools")):
        retries = 2 if "retry-tools" in model else 0
        message = _weather_reply(messages, last_user, cities, digest, retries)
    elif cities:
        message = {"role": "assistant", "content": f"I cannot check the weather in {', '.join(cities)} without a tool."}
    else:
        message = {"role": "assistant", "content": arithmetic(question) or UNKNOWN_ANSWER}
    prompt = " ".join(
        text_of(m.get("content")) + " " + " ".join(json.dumps(c) for c in m.get("tool_calls") or [])
        for m in messages
        if isinstance(m, dict)
    )
    out = (message.get("content") or "") + " ".join(json.dumps(c) for c in message.get("tool_calls", []))
    prompt_tokens = _tokens(prompt) + 3 * len(messages) + 10 * len(_tool_names(body.get("tools")))
    completion_tokens = _tokens(out)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "evalsi-stub",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error(status: int, message: str, kind: str) -> tuple[int, bytes, dict[str, str]]:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return status, json.dumps(body).encode(), {"content-type": "application/json"}


# --- the server ---------------------------------------------------------------------------------------------------


class StubLLM:
    """The stub server in a background thread: `with StubLLM() as llm:` serves at `llm.base_url` (`.../v1`) until the
    block ends. `requests` counts the chat requests answered (faults included); `last_body` / `last_headers` are
    the last one's."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.requests = 0
        self.last_body: Any = None
        self.last_headers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> StubLLM:
        self._server = _Server((self.host, self.port), _Handler, self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="stub-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StubLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (the command line)."""
        self._server = _Server((self.host, self.port), _Handler, self)
        self.port = self._server.server_address[1]
        print(f"listening on {self.base_url}", flush=True)
        try:
            self._server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self._server.server_close()

    def handle(self, raw: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        """Answer one chat request: (status, body, headers)."""
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "`messages` is required and must be a list", "invalid_request_error")
        with self._lock:
            self.requests += 1
            self.last_body, self.last_headers = body, headers
        faults = f"{headers.get('x-stub-fault', '')} {body.get('model', '')}"
        slow = _SLOW.search(faults)
        if slow:
            time.sleep(float(slow.group(1)) / (1000 if slow.group(2) == "ms" else 1))
        fail = _FAIL.search(faults)
        if fail and self._fails(fail, body):
            status, out, extra = _error(int(fail.group(1)), f"injected fault {fail.group()}", "server_error")
            after = _RETRY_AFTER.search(faults)
            if after:
                extra["retry-after"] = after.group(1)
            return status, out, extra
        if "bad-request" in faults:
            return _error(
                400, "injected fault bad-request: this model does not accept the request", "invalid_request_error"
            )
        if "not-json" in faults:
            return 200, b"this is not JSON", {"content-type": "text/plain"}
        if "malformed" in faults:
            return 200, json.dumps({"object": "list", "data": []}).encode(), {"content-type": "application/json"}
        return 200, json.dumps(reply(body)).encode(), {"content-type": "application/json"}

    def _fails(self, fail: re.Match[str], body: dict[str, Any]) -> bool:
        """Whether this request gets the injected failure: N times per distinct request, then once not."""
        times = fail.group(2) or "always"
        n = _TIMES[times] if times in _TIMES else int(times)
        if n < 0:
            return True
        key = hashlib.sha1(json.dumps([body.get("model"), body["messages"]], sort_keys=True).encode()).hexdigest()
        with self._lock:
            seen = self._failures.get(key, 0)
            if seen < n:
                self._failures[key] = seen + 1
                return True
            self._failures.pop(key, None)
            return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024  # the listen backlog: many clients connecting at once are not refused

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], stub: StubLLM) -> None:
        self.stub = stub
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a timed-out attempt) is no error of the stub's; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """End the kept-alive connections (their threads would go on serving after `shutdown`)."""
        with self._open_lock:
            open_, self._open = list(self._open), set()
        for sock in open_:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    server_version = "evalsi-stub-llm"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        """The whole response in one write (one system call: no wait between the headers and the body)."""
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        head = [f"HTTP/1.1 {status} {reason}", f"content-length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if self.close_connection:
            head.append("connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def do_POST(self) -> None:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            self.close_connection = True
            self._send(*_error(411, "send a content-length", "invalid_request_error"))
            return
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.split("?", 1)[0].rstrip("/") not in CHAT_PATHS:
            self._send(*_error(404, f"no route {self.path}", "invalid_request_error"))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._send(*self.server.stub.handle(raw, headers))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            body = {"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "evalsi"}]}
            self._send(200, json.dumps(body).encode(), {"content-type": "application/json"})
        elif path in ("/health", "/healthz"):
            self._send(200, b'{"status":"ok"}', {"content-type": "application/json"})
        else:
            self._send(*_error(404, f"no route {self.path}", "invalid_request_error"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evalsi.run_harness.stub_llm", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    args = parser.parse_args(argv)
    StubLLM(args.host, args.port).serve_forever()


if __name__ == "__main__":
    main()
