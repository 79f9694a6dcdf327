"""OTLP answers: the export response (with partial success) and `google.rpc.Status` error bodies, in either encoding."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# HTTP status -> the gRPC code a google.rpc.Status carries for it
HTTP_TO_CODE = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    404: code_pb2.UNIMPLEMENTED,  # as gRPC answers an unknown method (and the Collector maps an HTTP 404)
    405: code_pb2.UNIMPLEMENTED,
    413: code_pb2.INVALID_ARGUMENT,
    415: code_pb2.UNIMPLEMENTED,
    429: code_pb2.RESOURCE_EXHAUSTED,
    500: code_pb2.INTERNAL,
    503: code_pb2.UNAVAILABLE,
}


@dataclass(frozen=True)
class Violation:
    """What of a request could not be decoded: a `google.rpc.BadRequest` field violation."""

    reason: str  # UPPER_SNAKE_CASE, e.g. INVALID_JSON
    description: str
    field: str = ""  # the path of the field in the body (`resourceSpans[0].scopeSpans[1]...`); "": the whole body


def status_message(
    code: int, message: str, retry_after: float | None = None, violation: Violation | None = None
) -> status_pb2.Status:
    """A `google.rpc.Status`, with `RetryInfo` when the sender should retry after a delay and `BadRequest` when its
    request is refused for good, as the OTLP specification asks of failures."""
    status = status_pb2.Status(code=code, message=message)
    if retry_after is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(int(retry_after * 1e9))
        status.details.add().Pack(info)
    if violation is not None:
        bad = error_details_pb2.BadRequest()
        bad.field_violations.add(field=violation.field, description=violation.description, reason=violation.reason)
        status.details.add().Pack(bad)
    return status


def encode(message: object, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode()  # type: ignore[arg-type]
    return message.SerializeToString()  # type: ignore[attr-defined]


def export_response(rejected: int, message: str) -> ExportTraceServiceResponse:
    resp = ExportTraceServiceResponse()
    if rejected or message:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return resp


def logs_export_response(rejected: int, message: str) -> ExportLogsServiceResponse:
    resp = ExportLogsServiceResponse()
    if rejected or message:
        resp.partial_success.rejected_log_records = rejected
        resp.partial_success.error_message = message
    return resp
