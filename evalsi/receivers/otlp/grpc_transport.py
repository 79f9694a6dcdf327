"""OTLP/gRPC: `TraceService/Export` on a grpc.aio server, raw bytes in so decode errors get their own message (and a
`BadRequest`); refusals carry `RetryInfo` in `grpc-status-details-bin`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from evalsi.auth.authenticator import Authenticator
from evalsi.auth.grpc_gate import GrpcKeyCheck, principal_from_metadata
from evalsi.auth.principal import Principal, Unauthenticated
from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Codec, Decoded, DecodeFailed, OverLimit, ReceiverLimits
from evalsi.receivers.otlp.drain import RETRY_AFTER, SHUTTING_DOWN, Drain
from evalsi.receivers.otlp.http_transport import DECODE_THREADS, OFF_LOOP_BYTES
from evalsi.receivers.otlp.status import Violation, status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Codec, Decoded, str, bytes, bool, Principal | None], Awaitable[None]]


async def _abort(
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    *,
    retry_after: float | None = None,
    violation: Violation | None = None,
) -> None:
    """End the RPC with `code`, its `google.rpc.Status` (with `RetryInfo` / `BadRequest`) in `grpc-status-details-bin`
    as OTLP clients read it. Raises, as `context.abort` does."""
    details = status_message(code.value[0], message, retry_after, violation).SerializeToString()
    await context.abort(code, message, trailing_metadata=(("grpc-status-details-bin", details),))


class GrpcTransport:
    def __init__(
        self, export: Export, codecs: list[Codec], endpoint: str, max_recv_bytes: int,
        auth: Authenticator | None = None, drain: Drain | None = None, limits: ReceiverLimits | None = None,
    ) -> None:  # fmt: skip
        """`max_recv_bytes` bounds a message after decompression (gRPC's own check: RESOURCE_EXHAUSTED); the codecs
        apply `limits` (by default those of the receiver `export` belongs to) to what a message holds."""
        self._export = export
        self._auth = auth
        self._decoder = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="otlp-grpc-decode")
        self._limits = limits if limits is not None else ReceiverLimits()
        codecs = [self._limits.apply(codec) for codec in codecs]
        self._drain = drain if drain is not None else Drain()
        self._server = grpc.aio.server(
            interceptors=[GrpcKeyCheck(auth)] if auth is not None and auth.enabled else None,
            options=[
                ("grpc.max_receive_message_length", max_recv_bytes),
                ("grpc.so_reuseport", 0),
            ],
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
        if not self._drain.admit():  # the server's own stop would answer UNAVAILABLE without saying when to retry
            await _abort(context, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN, retry_after=RETRY_AFTER)
        try:
            return await self._answer(codec, request, context)
        finally:
            self._drain.release()

    async def _answer(self, codec: Codec, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            # a big message is decoded in a thread, as over HTTP: the event loop answers everything else meanwhile
            decoded: Decoded = (
                await asyncio.get_running_loop().run_in_executor(self._decoder, codec.from_protobuf, request)
                if len(request) > OFF_LOOP_BYTES
                else codec.from_protobuf(request)
            )
        except OverLimit as e:  # more items than the receiver takes in one request: the sender should split it
            self._limits.refused(e, "grpc")
            logger.warning("refused an OTLP/gRPC request (INVALID_ARGUMENT): %s", e)
            violation = Violation(e.reason, str(e), e.field)
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e), violation=violation)
        except DecodeFailed as e:
            violation = Violation(e.reason, str(e), e.field)
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e), violation=violation)
        try:  # the interceptor checked the credential already: this only reads who it is
            principal = principal_from_metadata(self._auth, context.invocation_metadata())
        except Unauthenticated as e:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, str(e))
        try:
            left = context.time_remaining()  # the sender's deadline: a wait for room ends before it
            answer_by = time.monotonic() + left if left is not None else 0.0
            await self._export(codec, decoded, "grpc", request, False, principal, answer_by)
        except Refused as r:
            code = grpc.StatusCode.UNAVAILABLE if r.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            # RetryInfo is what makes RESOURCE_EXHAUSTED retryable for OTLP clients
            await _abort(context, code, str(r), retry_after=r.retry_after)
        except Exception as e:  # a pipeline bug: answered, logged, never a hung RPC
            logger.exception("pipeline failed on a batch")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in the pipeline: {e}")
        return codec.response(decoded.rejected, decoded.message).SerializeToString()

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Close the listener: new RPCs fail (UNAVAILABLE, from the client's side), those in flight get up to `grace`
        seconds (the receiver's drain has answered them by then)."""
        await self._server.stop(grace)
        self._decoder.shutdown(wait=False)
