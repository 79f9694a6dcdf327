"""OTLP/gRPC: `TraceService/Export` on a grpc.aio server, raw bytes in so decode errors get their own message."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Codec, Decoded, DecodeFailed
from evalsi.receivers.otlp.status import status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Codec, Decoded, str], Awaitable[None]]


class GrpcTransport:
    def __init__(self, export: Export, codecs: list[Codec], endpoint: str, max_recv_bytes: int) -> None:
        self._export = export
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_recv_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        for codec in codecs:

            async def handle(request: bytes, context: grpc.aio.ServicerContext, codec: Codec = codec) -> bytes:
                return await self._handle(codec, request, context)

            handler = grpc.unary_unary_rpc_method_handler(handle)  # bytes in, bytes out
            generic = grpc.method_handlers_generic_handler(codec.grpc_service, {"Export": handler})
            self._server.add_generic_rpc_handlers((generic,))
        host_port = endpoint if not endpoint.startswith(":") else "0.0.0.0" + endpoint
        try:
            port = self._server.add_insecure_port(host_port)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {endpoint}: {e}; free the port or set another endpoint") from None
        if port == 0:
            raise OSError(f"cannot listen on {endpoint}: address in use or not available")
        self.endpoint = f"{host_port.rpartition(':')[0]}:{port}"

    async def _handle(self, codec: Codec, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            decoded: Decoded = codec.from_protobuf(request)
        except DecodeFailed as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            await self._export(codec, decoded, "grpc")
        except Refused as r:
            code = grpc.StatusCode.UNAVAILABLE if r.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            # RetryInfo is what makes RESOURCE_EXHAUSTED retryable for OTLP clients
            details = status_message(code.value[0], str(r), r.retry_after).SerializeToString()
            await context.abort(code, str(r), trailing_metadata=(("grpc-status-details-bin", details),))
        except Exception as e:  # a pipeline bug: answered, logged, never a hung RPC
            logger.exception("pipeline failed on a batch")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in the pipeline: {e}")
        return codec.response(decoded.rejected, decoded.message).SerializeToString()

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs, let those in flight finish (up to `grace` seconds)."""
        await self._server.stop(grace)
