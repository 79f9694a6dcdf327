"""OTLP/gRPC sending for the `otlp` exporter: one channel to the backend, and each failed call's status code mapped to
a retry (with the server's `RetryInfo`) or a refusal of the items. Imported only when an exporter sends over gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from evalsi.exporters.delivery import REFUSED_INVALID, REFUSED_TOO_LARGE, ItemsRefused, SendFailed
from evalsi.exporters.otlp_encode import LOGS_METHOD, TRACES_METHOD, rejected_in_answer

# the OTLP spec's retryable codes; RESOURCE_EXHAUSTED only when the server says when to come back (RetryInfo)
RETRYABLE_GRPC = {
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}


class GrpcSender:
    """One channel to the backend; an export is one unary call, its failure a retry or a refusal."""

    def __init__(
        self,
        endpoint: str,
        headers: dict[str, str],
        compression: str,
        timeout: float,
        insecure: bool,
        ca_file: str | None,
    ) -> None:
        """The `otlp` exporter's settings of the same names (`ca_file` is `tls.ca_file`)."""
        target = endpoint.split("://", 1)[-1]
        options = [("grpc.so_reuseport", 0)]
        if insecure:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            root = Path(ca_file).read_bytes() if ca_file else None
            self._channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root), options=options)
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())
        self._compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        self._timeout = timeout
        self._calls = {
            m: self._channel.unary_unary(m, request_serializer=None, response_deserializer=None)
            for m in (LOGS_METHOD, TRACES_METHOD)
        }

    async def send(self, method: str, body: bytes) -> tuple[int, str]:
        """One export; returns the answer's `partial_success` (rejected items, message)."""
        try:
            answer = await self._calls[method](
                body, timeout=self._timeout, metadata=self._metadata, compression=self._compression
            )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            message = f"gRPC {code.name}: {e.details()}"
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ItemsRefused(message, reason=REFUSED_INVALID) from None
            retry_after = _retry_info(e.trailing_metadata())
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after is None and _too_large(e.details()):
                raise ItemsRefused(message, reason=REFUSED_TOO_LARGE) from None
            retryable = code in RETRYABLE_GRPC or (
                code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after is not None
            )
            raise SendFailed(message, retryable=retryable, retry_after=retry_after) from None
        return rejected_in_answer(answer or b"", spans=method == TRACES_METHOD)

    async def close(self) -> None:
        await self._channel.close()


def _too_large(details: str | None) -> bool:
    """gRPC's own refusal of a message above the server's size limit ("Received message larger than max")."""
    return "larger than max" in (details or "")


def _retry_info(metadata: Any) -> float | None:
    for key, value in metadata or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                return info.retry_delay.ToNanoseconds() / 1e9
    return None
