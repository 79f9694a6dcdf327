"""Where a run's traces go and who scores them: a running collector (`--collector URL`, its API), or one started
in this process on the embedded store (the config from `-c`, its receivers and API moved to free loopback ports)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from evalsi.auth.keys import api_headers
from evalsi.collector.config import DEFAULT_CONFIG, Config, parse_config, type_of


class CollectorError(Exception):
    """The run cannot reach or start a collector; the message says what to do."""


@dataclass
class CollectorLink:
    api_url: str
    """The collector's API (`/v1/runs/...`, `/api/v1/...`)."""
    otlp_url: str
    """Its OTLP/HTTP base URL (`/v1/traces` is appended)."""
    where: str
    """Which collector: `collector at URL` or `in-process collector at URL`."""
    store: str = "store unknown"
    """The store it writes to, as its status names it (`embedded store at /abs/path`)."""


def _host_for(endpoint: str, api_host: str) -> str:
    host, _, port = endpoint.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = api_host
    return f"http://{host}:{port}"


def remote(api_url: str) -> CollectorLink:
    """A running collector, found by its API URL: its status says where its OTLP/HTTP receiver listens."""
    api_url = api_url.rstrip("/")
    try:
        resp = httpx.get(api_url + "/api/v1/status", timeout=10, headers=api_headers())
    except httpx.HTTPError as e:
        raise CollectorError(f"cannot reach the evalsi API at {api_url}: {e}; is `evalsi serve` running?") from None
    if resp.status_code != 200:
        raise CollectorError(f"{api_url}/api/v1/status answered {resp.status_code}: is this an evalsi collector?")
    status = resp.json()
    receivers = status.get("receivers", {})
    http = next((e["http"] for e in receivers.values() if isinstance(e, dict) and e.get("http")), None)
    if http is None:
        raise CollectorError(
            f"the collector at {api_url} has no OTLP/HTTP receiver; enable receivers.otlp.protocols.http"
        )
    otlp = _host_for(http, urlsplit(api_url).hostname or "127.0.0.1")
    return CollectorLink(api_url, otlp, f"collector at {api_url}", status.get("store") or "no store")


def _loopback(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with every OTLP receiver on OTLP/HTTP at a free loopback port, the API there too, no
    self-metrics server (an in-process collector must not clash with one already serving), and one process unless
    the config asks for workers (a run's traces need no more; workers would cost seconds to start)."""
    out = dict(raw)
    receivers = dict(out.get("receivers") or {})
    for rid in receivers:
        if type_of(rid) == "otlp":
            receivers[rid] = {"protocols": {"http": {"endpoint": "127.0.0.1:0"}}}
    out["receivers"] = receivers
    service = dict(out.get("service") or {})
    service["api"] = {"endpoint": "127.0.0.1:0"}
    if service.get("workers", "auto") == "auto":
        service["workers"] = 1
    telemetry = dict(service.get("telemetry") or {})
    telemetry["metrics"] = {"level": "none"}
    service["telemetry"] = telemetry
    out["service"] = service
    return out


class InProcessCollector:
    """A collector service on its own event loop thread, for a run without `--collector`."""

    def __init__(self, config_path: Path | None) -> None:
        if config_path is None:
            raw: Any = DEFAULT_CONFIG
            source = "(defaults)"
        else:
            try:
                raw = yaml.safe_load(config_path.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise CollectorError(f"cannot read {config_path}: {e}") from None
            source = str(config_path)
        if not isinstance(raw, dict):
            raise CollectorError(f"{source}: not a config mapping")
        self.config: Config = parse_config(_loopback(raw), source, base_dir=config_path.parent if config_path else None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._service: Any = None

    def start(self) -> CollectorLink:
        from evalsi.collector.service import Service  # the service pulls in every component: only when run alone

        ready: threading.Event = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._service = Service(self.config, role="run")
            try:
                loop.run_until_complete(self._service.start())
            except BaseException as e:
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_until_complete(self._service.stopped())
            finally:
                loop.run_until_complete(self._service.shutdown())
                loop.close()

        self._thread = threading.Thread(target=main, name="evalsi-collector", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise CollectorError(f"cannot start the in-process collector: {failure[0]}")
        status = self._service.status()
        http = next((e["http"] for e in status["receivers"].values() if e.get("http")), None)
        assert http is not None and status["api"]
        api = f"http://{status['api']}"
        return CollectorLink(api, f"http://{http}", f"in-process collector at {api}", status["store"] or "no store")

    def stop(self) -> None:
        """Drain every buffer into the store, then stop."""
        if self._loop is not None and self._service is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._service.stop)
            self._thread.join()

    @property
    def unstored(self) -> dict[str, int]:
        return dict(self._service.unstored) if self._service is not None else {}
