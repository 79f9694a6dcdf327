"""The ports a config listens on, and which of them something else holds: read from the config's YAML with nothing
heavy imported, so a second `evalsi serve` fails at once, naming each port and the key that sets it. Owns the
default endpoints the config models take."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

API_ENDPOINT = "127.0.0.1:8080"
METRICS_ADDRESS = "127.0.0.1:8888"
OTLP_GRPC_ENDPOINT = "127.0.0.1:4317"
OTLP_HTTP_ENDPOINT = "127.0.0.1:4318"
PROMETHEUS_ENDPOINT = "127.0.0.1:9464"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`, or `:port` for all interfaces) as (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid endpoint {endpoint!r}: expected host:port, e.g. 127.0.0.1:4318")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def taken(endpoints: list[tuple[str, str]]) -> list[str]:
    """Of (config key, endpoint) pairs, those something else listens on, each as `key: endpoint is in use; ...`.

    Checked before anything starts, so a clash names the key to change and leaves nothing behind (no store, no
    write-ahead log); port 0 is never taken."""
    busy = []
    for key, endpoint in endpoints:
        host, port = parse_endpoint(endpoint)
        if port == 0:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as `serving.bind` does: TIME_WAIT is free
            try:
                sock.bind((host, port))
            except OSError as e:
                why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be listened on: {e.strerror}"
                busy.append(f"{key}: {endpoint} {why}; stop what listens there or set another endpoint")
    return busy


def _section(node: Any, key: str) -> dict[str, Any]:
    value = node.get(key) if isinstance(node, dict) else None
    return value if isinstance(value, dict) else {}


def _plain(value: Any, default: str) -> str | None:
    """An endpoint as written, the default when left out; None when the environment or a mistake decides it (the
    config's own check reads those)."""
    if value is None:
        return default
    if not isinstance(value, str) or "env:" in value or "${" in value:
        return None
    try:
        parse_endpoint(value)
    except ValueError:
        return None
    return value


def claimed(raw: Any) -> list[tuple[str, str]]:
    """The (key path, endpoint) pairs a config document (as YAML reads it) listens on, as `config.listeners` finds
    them in the validated config: the API, self-metrics, each `otlp` receiver's protocols and each `prometheus`
    exporter; an endpoint from the environment is left out."""
    service = _section(raw, "service")
    found = [("service.api.endpoint", _plain(_section(service, "api").get("endpoint"), API_ENDPOINT))]
    metrics = _section(_section(service, "telemetry"), "metrics")
    if metrics.get("level") != "none":
        found.append(("service.telemetry.metrics.address", _plain(metrics.get("address"), METRICS_ADDRESS)))
    for rid, receiver in _section(raw, "receivers").items():
        if str(rid).split("/", 1)[0] != "otlp":
            continue
        receiver = receiver if isinstance(receiver, dict) else {}
        protocols = receiver.get("protocols")
        listed = {"grpc": {}, "http": {}} if protocols is None else protocols if isinstance(protocols, dict) else {}
        for name, default in (("grpc", OTLP_GRPC_ENDPOINT), ("http", OTLP_HTTP_ENDPOINT)):
            if name in listed:
                key = f"receivers.{rid}.protocols.{name}.endpoint"
                found.append((key, _plain(_section(listed, name).get("endpoint"), default)))
    for eid, exporter in _section(raw, "exporters").items():
        if str(eid).split("/", 1)[0] == "prometheus":
            found.append((f"exporters.{eid}.endpoint", _plain(_section({"e": exporter}, "e").get("endpoint"),
                                                            PROMETHEUS_ENDPOINT)))  # fmt: skip
    return [(key, endpoint) for key, endpoint in found if endpoint is not None]


DEFAULT_LISTENING: dict[str, Any] = {"receivers": {"otlp": {}}}
"""What of the built-in default config (`config.DEFAULT_CONFIG`) listens: its `otlp` receiver, the API, metrics."""


def claimed_in(path: Path | None) -> list[tuple[str, str]]:
    """`claimed` of the config file at `path` (None: the built-in defaults); none when the file cannot be read (the
    config's own check says why)."""
    if path is None:
        return claimed(DEFAULT_LISTENING)
    import yaml

    try:
        return claimed(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError):
        return []
