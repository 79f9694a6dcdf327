"""The client of a running collector's HTTP API (`--api`), on the standard library alone."""

from __future__ import annotations

import json
import os
from typing import Any

from evalsi.cli.render import fail

KEY_ENV = "EVALSI_API_KEY"  # evalsi.auth.keys.KEY_ENV, named here so `--api` need not import auth (grpc, pydantic)


def api_headers() -> dict[str, str]:
    """`evalsi.auth.keys.api_headers`: the key in `EVALSI_API_KEY`, if set."""
    key = os.environ.get(KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


class Api:
    """Reads through a collector's API, like `evalsi.collector.query.ApiReader` but on the standard library alone
    (httpx loads its own CLI, rich and pygments): `--api` loads neither the config nor the store."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.where = f"API at {self.url}"

    def get(self, path: str, key: str | None = None, missing: Any = None, **params: Any) -> Any:
        """GET `path` and return its JSON (or its `key`); `missing` on a 404 if given, else an error."""
        import urllib.error
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        request = urllib.request.Request(self.url + path + (f"?{query}" if query else ""), headers=api_headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing is not None:
                return missing
            body = e.read().decode(errors="replace")
            try:
                detail = str(json.loads(body).get("detail", body))
            except (ValueError, AttributeError):
                detail = body
            if e.code == 401:
                detail += f"; set {KEY_ENV} to an API key of this collector"
            raise fail(f"{self.where} answered {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise fail(f"cannot reach the evalsi API at {self.url}: {reason}; is `evalsi serve` running?") from None
        return doc if key is None else doc[key]

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        return self.get("/api/v1/scores", "scores", limit=limit, trace_id=trace_id, policy=policy)

    def search_traces(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.get("/api/v1/traces", **params)

    def read_trace(self, trace_id: str, *, limit: int, offset: int) -> dict[str, Any] | None:
        doc = self.get(f"/api/v1/traces/{trace_id}", missing={}, limit=limit, offset=offset)
        if doc:
            doc["scores"] = self.list_scores(limit=1000, trace_id=trace_id, policy=None)
        return doc or None

    def list_sessions(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self.get("/api/v1/sessions", "sessions", **params)

    def show_session(self, session_id: str, *, limit: int) -> dict[str, Any] | None:
        import urllib.parse

        return self.get(f"/api/v1/sessions/{urllib.parse.quote(session_id, safe='')}", missing={}, limit=limit) or None

    def close(self) -> None:
        pass
