"""The `otlp` receiver: OTLP traces and logs over gRPC and HTTP, decoded into batches and handed to the pipelines."""

from __future__ import annotations

import time
from dataclasses import replace

from evalsi.auth import gate
from evalsi.component import Next, Refused, Settings, receiver
from evalsi.encoded import EncodedBatch
from evalsi.log_record import LogBatch
from evalsi.receivers.otlp.config import MIB, OtlpReceiverConfig
from evalsi.receivers.otlp.decode import (
    LOGS,
    TRACES,
    Codec,
    Decoded,
    checking_codec,
    count_clamped,
    decode_encoded,
)
from evalsi.receivers.otlp.drain import Drain
from evalsi.receivers.otlp.grpc_transport import GrpcTransport
from evalsi.receivers.otlp.http_transport import build_app, otlp_refusal
from evalsi.serving import AsgiServer
from evalsi.span import SpanBatch


@receiver("otlp", config=OtlpReceiverConfig, signals=("traces", "logs"), decode=decode_encoded)
class OtlpReceiver:
    """Serves the signals its pipelines take: a logs endpoint only exists when a logs pipeline lists it."""

    def __init__(self, config: OtlpReceiverConfig, settings: Settings, next: Next) -> None:
        self._config = config
        self._settings = settings
        self._next = next
        self._codecs = [c for c in (TRACES, LOGS) if c.signal in next.signals]
        if next.encoded is not None:  # the pipelines run in worker processes, which decode
            self._codecs = [checking_codec(c, next.encoded.shards) for c in self._codecs]
        self._grpc: GrpcTransport | None = None
        self._http: AsgiServer | None = None
        self._drain = Drain()  # requests in flight on both transports, and whether new ones are taken
        self.endpoints: dict[str, str] = {}
        m = settings.metrics
        transports = ("grpc", "http")
        self._accepted = {
            "traces": {t: m.receiver_accepted_spans.labels(settings.id, t) for t in transports},
            "logs": {t: m.receiver_accepted_log_records.labels(settings.id, t) for t in transports},
        }
        self._refused = {
            "traces": {t: m.receiver_refused_spans.labels(settings.id, t) for t in transports},
            "logs": {t: m.receiver_refused_log_records.labels(settings.id, t) for t in transports},
        }

    async def _export(self, codec: Codec, decoded: Decoded, transport: str) -> None:
        refused = self._refused[codec.signal][transport]
        if decoded.rejected:
            refused.inc(decoded.rejected)
            self._settings.logger.warning("invalid %s: %s", codec.signal, decoded.message)
        if decoded.clamped:  # decoded here; with pipeline workers, the workers count and log these
            count_clamped(self._settings.metrics, self._settings.id, codec.signal, decoded, self._settings.logger)
        n = len(decoded.batch)
        if not n:
            return
        try:
            if isinstance(decoded.batch, EncodedBatch):
                assert self._next.encoded is not None
                await self._next.encoded.consume_encoded(replace(decoded.batch, receiver=self._settings.id))
            elif isinstance(decoded.batch, SpanBatch):
                await self._next.consume(decoded.batch)
            elif isinstance(decoded.batch, LogBatch):
                await self._next.consume_logs(decoded.batch)
        except Refused:
            refused.inc(n)
            raise
        self._accepted[codec.signal][transport].inc(n)

    async def start(self) -> None:
        protocols = self._config.protocols
        log = self._settings.logger
        if protocols.grpc is not None:
            self._grpc = GrpcTransport(
                self._export, self._codecs, protocols.grpc.endpoint, protocols.grpc.max_recv_msg_size_mib * MIB,
                auth=self._settings.auth, drain=self._drain,
            )  # fmt: skip
            await self._grpc.start()
            self.endpoints["grpc"] = self._grpc.endpoint
            log.info("listening", extra={"protocol": "grpc", "endpoint": self._grpc.endpoint})
        if protocols.http is not None:
            paths = {"traces": protocols.http.traces_url_path, "logs": protocols.http.logs_url_path}
            routes = {paths[c.signal]: c for c in self._codecs}
            app = build_app(self._export, routes, max_body=protocols.http.max_request_body_size, drain=self._drain)
            self._http = AsgiServer(
                gate(app, self._settings.auth, surface="otlp_http", refusal=otlp_refusal), protocols.http.endpoint
            )
            await self._http.start()
            self.endpoints["http"] = self._http.endpoint
            log.info("listening", extra={"protocol": "http", "endpoint": self._http.endpoint})

    async def shutdown(self) -> None:
        """Drain, then close the listeners: new requests are answered 503 / UNAVAILABLE with `Retry-After` /
        `RetryInfo` (so senders retry, on another replica or after the restart) while those in flight finish and
        requests keep coming; then the listeners close. What was answered 200 is in the pipeline by then, which
        the service drains next."""
        t0 = time.monotonic()
        answered = await self._drain.close()
        if not answered:
            self._settings.logger.warning(
                "%d requests still in flight after %.0fs of draining; closing the listeners (what they hand on "
                "in time is kept; a sender left unanswered retries)",
                self._drain.in_flight,
                time.monotonic() - t0,
            )
        if self._grpc is not None:
            await self._grpc.stop(grace=1)
        if self._http is not None:
            await self._http.stop()
        self._settings.logger.info(
            "stopped listening",
            extra={"refused_while_draining": self._drain.refused, "drain_s": round(time.monotonic() - t0, 3)},
        )
