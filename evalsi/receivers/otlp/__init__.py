"""The `otlp` receiver: OTLP traces over gRPC and HTTP, decoded into span batches and handed to the pipeline."""

from __future__ import annotations

from evalsi.component import Consumer, Refused, Settings, receiver
from evalsi.receivers.otlp.config import MIB, OtlpReceiverConfig
from evalsi.receivers.otlp.decode import Decoded
from evalsi.receivers.otlp.grpc_transport import GrpcTransport
from evalsi.receivers.otlp.http_transport import build_app
from evalsi.serving import AsgiServer


@receiver("otlp", config=OtlpReceiverConfig)
class OtlpReceiver:
    def __init__(self, config: OtlpReceiverConfig, settings: Settings, next: Consumer) -> None:
        self._config = config
        self._settings = settings
        self._next = next
        self._grpc: GrpcTransport | None = None
        self._http: AsgiServer | None = None
        self.endpoints: dict[str, str] = {}
        m = settings.metrics
        self._accepted = {t: m.receiver_accepted_spans.labels(settings.id, t) for t in ("grpc", "http")}
        self._refused = {t: m.receiver_refused_spans.labels(settings.id, t) for t in ("grpc", "http")}

    async def _export(self, decoded: Decoded, transport: str) -> None:
        if decoded.rejected:
            self._refused[transport].inc(decoded.rejected)
            self._settings.logger.warning("rejected invalid spans: %s", decoded.message)
        n = len(decoded.batch)
        if not n:
            return
        try:
            await self._next.consume(decoded.batch)
        except Refused:
            self._refused[transport].inc(n)
            raise
        self._accepted[transport].inc(n)

    async def start(self) -> None:
        protocols = self._config.protocols
        log = self._settings.logger
        if protocols.grpc is not None:
            self._grpc = GrpcTransport(
                self._export, protocols.grpc.endpoint, protocols.grpc.max_recv_msg_size_mib * MIB
            )
            await self._grpc.start()
            self.endpoints["grpc"] = self._grpc.endpoint
            log.info("listening", extra={"protocol": "grpc", "endpoint": self._grpc.endpoint})
        if protocols.http is not None:
            app = build_app(
                self._export,
                path=protocols.http.traces_url_path,
                max_body=protocols.http.max_request_body_size,
            )
            self._http = AsgiServer(app, protocols.http.endpoint)
            await self._http.start()
            self.endpoints["http"] = self._http.endpoint
            log.info("listening", extra={"protocol": "http", "endpoint": self._http.endpoint})

    async def shutdown(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=10)
        if self._http is not None:
            await self._http.stop()
