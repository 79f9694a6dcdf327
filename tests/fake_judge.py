"""A local OpenAI-compatible chat/completions server for judge tests: records requests, answers verdicts."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeJudge:
    """An OpenAI-compatible chat/completions server: records each request, answers from a script of
    (status, body, headers) and then with `verdict`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.script: list[tuple[int, Any, dict[str, str]]] = []
        self.verdict: str = json.dumps({"score": 0.9, "passed": True, "label": "correct", "explanation": "Paris."})
        self.usage = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
        self.delay_s = 0.0
        """How long each answer takes (a slow judge)."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                owner.requests.append({"path": self.path, **body})
                owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                if owner.script:
                    status, payload, headers = owner.script.pop(0)
                else:
                    status, payload, headers = 200, owner.completion(owner.verdict), {}
                raw = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def completion(self, content: str) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "judge-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": self.usage,
        }
