"""OTLP/gRPC behind the credential check: an interceptor that refuses a call with UNAUTHENTICATED, and the principal
of a call its handler reads from the call's metadata."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc

from evalsi.auth.authenticator import Authenticator
from evalsi.auth.principal import ANONYMOUS_PRINCIPAL, Principal, Refusal


def principal_from_metadata(
    auth: Authenticator | None, metadata: Iterable[Any] | Mapping[str, Any] | None
) -> Principal:
    """The principal of a gRPC call from its invocation metadata (`context.invocation_metadata()`: (key, value)
    pairs): for a handler behind `GrpcKeyCheck`, which refused the call already if its credential was not valid
    (so this counts nothing). Raises `Refusal`. No `auth` (or mode none): anonymous."""
    if auth is None or not auth.enabled:
        return ANONYMOUS_PRINCIPAL
    return auth.identify(_authorization(metadata))


def _authorization(metadata: Iterable[Any] | Mapping[str, Any] | None) -> str | None:
    """The first `authorization` value of gRPC metadata."""
    pairs: Iterable[Any] = metadata.items() if isinstance(metadata, Mapping) else (metadata or ())
    for pair in pairs:
        key, value = (pair.key, pair.value) if hasattr(pair, "key") else pair
        if isinstance(key, str) and key.lower() == "authorization":
            return value if isinstance(value, str) else None
    return None


class GrpcKeyCheck(grpc.aio.ServerInterceptor):
    """Refuses an RPC without a valid key or token in its `authorization` metadata with UNAUTHENTICATED. The
    handler finds the call's principal with `principal_from_metadata`."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        value = _authorization(details.invocation_metadata)  # type: ignore[attr-defined]
        try:
            await self._auth.identify_async(value, "otlp_grpc")
        except Refusal as e:
            message = str(e)

            async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
                return b""

            return grpc.unary_unary_rpc_method_handler(refuse)
        return await continuation(details)
