"""OTLP/gRPC: `TraceService/Export` on a grpc.aio server, raw bytes in so decode errors get their own message."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Decoded, DecodeFailed, decode_traces_protobuf
from evalsi.receivers.otlp.status import export_response, status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Decoded, str], Awaitable[None]]

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcTransport:
    def __init__(self, export: Export, endpoint: str, max_recv_bytes: int) -> None:
        self._export = export
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_recv_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        handler = grpc.unary_unary_rpc_method_handler(self._handle)  # bytes in, bytes out
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        host_port = endpoint if not endpoint.startswith(":") else "0.0.0.0" + endpoint
        try:
            port = self._server.add_insecure_port(host_port)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {endpoint}: {e}; free the port or set another endpoint") from None
        if port == 0:
            raise OSError(f"cannot listen on {endpoint}: address in use or not available")
        self.endpoint = f"{host_port.rpartition(':')[0]}:{port}"

    async def _handle(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            decoded: Decoded = decode_traces_protobuf(request)
        except DecodeFailed as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            await self._export(decoded, "grpc")
        except Refused as r:
            code = grpc.StatusCode.UNAVAILABLE if r.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            # RetryInfo is what makes RESOURCE_EXHAUSTED retryable for OTLP clients
            details = status_message(code.value[0], str(r), r.retry_after).SerializeToString()
            await context.abort(code, str(r), trailing_metadata=(("grpc-status-details-bin", details),))
        except Exception as e:  # a pipeline bug: answered, logged, never a hung RPC
            logger.exception("pipeline failed on a batch")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in the pipeline: {e}")
        return export_response(decoded.rejected, decoded.message).SerializeToString()

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs, let those in flight finish (up to `grace` seconds)."""
        await self._server.stop(grace)
