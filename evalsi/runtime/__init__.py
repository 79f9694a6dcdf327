"""The runtime the service runs on: the retry policy senders share (`backoff`), supervised background tasks
(`supervise`), serving ASGI apps (`serving`), self-metrics (`telemetry`), the ports a config listens on (`ports`),
what components hold for the write-ahead log (`held`), pandas kept out of pyarrow's and chDB's checks
(`pandas_hidden`), and lazy exports for a package (`lazy`).

Its names are exported lazily: `ports` must load without uvicorn (`serving`) or prometheus_client (`telemetry`), so
that a second `evalsi serve` fails at once, naming the port it finds taken.
"""

from __future__ import annotations

from evalsi.runtime.lazy import lazy_exports

_EXPORTS = {
    "Backoff": "backoff", "RETRYABLE_HTTP": "backoff", "retry_after": "backoff",
    "supervise": "supervise",
    "AsgiServer": "serving", "bind": "serving", "bound_endpoint": "serving",
    "SelfMetrics": "telemetry", "items_refused_counter": "telemetry",
    "API_ENDPOINT": "ports", "DEFAULT_LISTENING": "ports", "METRICS_ADDRESS": "ports", "OTLP_GRPC_ENDPOINT": "ports",
    "OTLP_HTTP_ENDPOINT": "ports", "PROMETHEUS_ENDPOINT": "ports", "claimed": "ports", "claimed_in": "ports",
    "parse_endpoint": "ports", "taken": "ports",
    "InFlight": "held", "arrived_of": "held", "earliest": "held", "stamp": "held", "stamp_project": "held",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
