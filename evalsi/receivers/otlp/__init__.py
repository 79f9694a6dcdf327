"""The `otlp` receiver: OTLP traces and logs over gRPC and HTTP, decoded into batches and handed to the pipelines.

The gRPC and HTTP transports are imported when their listener starts: pipeline workers load this module (for its
decode) but never serve (grpc costs a process ~8 MB)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from evalsi.auth.asgi_gate import gate
from evalsi.auth.principal import Principal
from evalsi.component import Next, Refused, Settings, receiver
from evalsi.model.encoded import EncodedBatch
from evalsi.model.log_record import LogBatch
from evalsi.model.score import DEFAULT_PROJECT
from evalsi.model.span import SpanBatch, project_of
from evalsi.receivers.otlp.config import MIB, OtlpReceiverConfig
from evalsi.receivers.otlp.decode import (
    LOGS,
    TRACES,
    Codec,
    Decoded,
    DecodeFailed,
    ReceiverLimits,
    checking_codec,
    count_clamped,
    decode_encoded,
)
from evalsi.receivers.otlp.drain import Drain
from evalsi.runtime.held import stamp, stamp_project
from evalsi.wal import drop_spans, span_key

if TYPE_CHECKING:
    from evalsi.receivers.otlp.grpc_transport import GrpcTransport
    from evalsi.runtime.serving import AsgiServer


@receiver("otlp", config=OtlpReceiverConfig, signals=("traces", "logs"), decode=decode_encoded)
class OtlpReceiver:
    """Serves the signals its pipelines take: a logs endpoint only exists when a logs pipeline lists it."""

    def __init__(self, config: OtlpReceiverConfig, settings: Settings, next: Next) -> None:
        self._config = config
        self._settings = settings
        self._next = next
        self._codecs = [c for c in (TRACES, LOGS) if c.signal in next.signals]
        self._limits = ReceiverLimits(config.limits, f"receivers.{settings.id}.limits", settings.id, settings.metrics)
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

    async def _export(
        self,
        codec: Codec,
        decoded: Decoded,
        transport: str,
        body: bytes,
        json: bool,
        principal: Principal | None,
        answer_by: float = 0.0,
    ) -> None:
        """Hand the request on; `answer_by`: when (monotonic) the sender stops waiting for the answer, if it said."""
        refused = self._refused[codec.signal][transport]
        if decoded.rejected:
            refused.inc(decoded.rejected)
            self._settings.logger.warning("invalid %s: %s", codec.signal, decoded.message)
        if decoded.clamped:  # decoded here; with pipeline workers, the workers count and log these
            count_clamped(self._settings.metrics, self._settings.id, codec.signal, decoded, self._settings.logger)
        n = len(decoded.batch)
        if not n:
            return
        wal = self._settings.wal
        project = self._project(principal)
        try:
            if wal is None:
                await self._hand_on(decoded, project=project, answer_by=answer_by)
            else:
                wal.check_room()  # before the pipeline takes it: a refusal after would mean a duplicate
                if codec.signal == "traces" and wal.replayed_spans.active():
                    decoded = self._without_replayed(codec, decoded, wal, project or "")
                    if not len(decoded.batch):
                        return  # every span of it was replayed already: a sender's second copy
                arrived = time.monotonic()
                if isinstance(decoded.batch, EncodedBatch):  # JSON already re-encoded: log the protobuf
                    body, json = decoded.batch.body, False
                # on disk before the pipeline takes it: a write that fails refuses a request nothing took, and a
                # crash from here on replays it at the next start
                fmt = "json" if json else "protobuf"
                seq = await wal.append(codec.signal, fmt, self._settings.id, body, arrived, project or "")
                try:
                    await self._hand_on(decoded, arrived, project, answer_by)
                except Refused:
                    await wal.void(seq)  # the sender sends it again: replay leaves this copy out
                    raise
                finally:
                    wal.settled(seq)
        except Refused:
            refused.inc(n)
            raise
        self._accepted[codec.signal][transport].inc(n)

    def _without_replayed(self, codec: Codec, decoded: Decoded, wal: Any, project: str) -> Decoded:
        """The request without the spans the write-ahead log replayed at start (sent again by a sender that never got
        the answer to the first copy), counted; a span of another project with the same ids is not one of them.
        `project`: the credential's, "" when none was checked."""
        again = wal.replayed_spans.again
        batch = decoded.batch
        if isinstance(batch, SpanBatch):
            spans = [s for s in batch.spans if not again(span_key(project or project_of(s), s.trace_id, s.span_id))]
            dropped = len(batch.spans) - len(spans)
            if dropped:
                decoded = replace(decoded, batch=SpanBatch(spans, batch.revision, batch.kind))
        elif isinstance(batch, EncodedBatch):
            body, dropped = drop_spans(batch.body, again, project=project)
            if dropped:
                checked = codec.from_protobuf(body)
                decoded = replace(decoded, batch=checked.batch)
        else:
            return decoded
        if dropped:
            wal.duplicates.inc(dropped)
            self._settings.logger.info("dropped %d spans the write-ahead log replayed, sent again", dropped)
        return decoded

    def _project(self, principal: Principal | None) -> str | None:
        """The project the sender writes to: its credential's, when credentials are checked (None: the spans keep
        the `evalsi.project` resource attribute they came with, if any)."""
        auth = self._settings.auth
        if auth is None or not auth.enabled:
            return None
        return principal.project if principal is not None else DEFAULT_PROJECT

    async def _hand_on(
        self, decoded: Decoded, arrived: float = 0.0, project: str | None = None, answer_by: float = 0.0
    ) -> None:
        batch = decoded.batch
        if isinstance(batch, EncodedBatch):
            assert self._next.encoded is not None
            batch = replace(
                batch, receiver=self._settings.id, arrived=arrived, project=project or "", answer_by=answer_by
            )
            await self._next.encoded.consume_encoded(batch)
            return
        if arrived:
            stamp(batch, arrived)
        if project is not None:
            stamp_project(batch, project)
        if isinstance(batch, SpanBatch):
            await self._next.consume(batch)
        elif isinstance(batch, LogBatch):
            await self._next.consume_logs(batch)

    def protobuf_of(self, signal: str, fmt: str, body: bytes) -> bytes:
        """A request this receiver logged, as protobuf (an OTLP/JSON one re-encoded)."""
        if fmt == "protobuf":
            return body
        decoded = checking_codec(TRACES if signal == "traces" else LOGS, 1).from_json(body)
        assert isinstance(decoded.batch, EncodedBatch)
        return decoded.batch.body

    async def replay(self, signal: str, body: bytes, project: str = "") -> None:
        """Hand on a request a previous run logged (protobuf) and answered, waiting while the pipeline refuses."""
        codec = next((c for c in self._codecs if c.signal == signal), None)
        if codec is None:
            self._settings.logger.error("write-ahead log: %s no pipeline takes any more are left out", signal)
            return
        try:
            decoded = self._limits.apply(codec).from_protobuf(body)
        except DecodeFailed as e:  # e.g. limits lowered since it was logged: the request is refused now, as it would be
            self._settings.logger.error("write-ahead log: a logged request is refused on replay: %s", e)
            return
        if not len(decoded.batch):
            return
        delay = 0.01
        while True:
            try:
                await self._hand_on(decoded, time.monotonic(), project or None)
                return
            except Refused as r:
                await asyncio.sleep(min(delay, r.retry_after))
                delay = min(delay * 2, 0.5)

    async def start(self) -> None:
        protocols = self._config.protocols
        log = self._settings.logger
        if protocols.grpc is not None:
            from evalsi.receivers.otlp.grpc_transport import GrpcTransport

            self._grpc = GrpcTransport(
                self._export, self._codecs, protocols.grpc.endpoint, protocols.grpc.max_recv_msg_size_mib * MIB,
                auth=self._settings.auth, drain=self._drain, limits=self._limits,
            )  # fmt: skip
            await self._grpc.start()
            self.endpoints["grpc"] = self._grpc.endpoint
            log.info("listening", extra={"protocol": "grpc", "endpoint": self._grpc.endpoint})
        if protocols.http is not None:
            paths = {"traces": protocols.http.traces_url_path, "logs": protocols.http.logs_url_path}
            routes = {paths[c.signal]: c for c in self._codecs}
            max_body = protocols.http.max_request_body_size
            # here, as the gRPC transport: a pipeline worker imports this module to decode, and serves nothing
            from evalsi.receivers.otlp.http_transport import build_app, otlp_refusal
            from evalsi.runtime.serving import AsgiServer

            app = build_app(self._export, routes, max_body=max_body, drain=self._drain, limits=self._limits)

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
