"""Config of the OTLP receiver: which protocols listen where, how large a request may be, and what one may carry."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator, model_validator

from evalsi.component import ComponentConfig
from evalsi.limits import MIB, at_least_one, not_bool
from evalsi.runtime.ports import OTLP_GRPC_ENDPOINT, OTLP_HTTP_ENDPOINT, parse_endpoint


def _endpoint(value: str) -> str:
    parse_endpoint(value)
    return value


class GrpcConfig(ComponentConfig):
    endpoint: str = OTLP_GRPC_ENDPOINT
    max_recv_msg_size_mib: int = 20

    _check_endpoint = field_validator("endpoint")(_endpoint)
    _not_bool = field_validator("max_recv_msg_size_mib", mode="before")(not_bool)
    _check_size = field_validator("max_recv_msg_size_mib")(at_least_one)

    @field_validator("max_recv_msg_size_mib")
    @classmethod
    def _fits_grpc(cls, value: int) -> int:
        if value * MIB > 2**31 - 1:  # gRPC takes the size as a 32-bit int and fails to start past it
            raise ValueError(f"must be at most 2047 (gRPC's largest message is 2 GiB - 1 byte), got {value}")
        return value


class HttpConfig(ComponentConfig):
    endpoint: str = OTLP_HTTP_ENDPOINT
    max_request_body_size: int = 20 * MIB
    traces_url_path: str = "/v1/traces"
    logs_url_path: str = "/v1/logs"

    _check_endpoint = field_validator("endpoint")(_endpoint)
    _not_bool = field_validator("max_request_body_size", mode="before")(not_bool)
    _check_size = field_validator("max_request_body_size")(at_least_one)


class Limits(ComponentConfig):
    """What one request may carry (docs/receivers/otlp.md#limits). The count defaults are 8x the OpenTelemetry SDKs'
    own (128); the value length fits a whole 200k-token conversation in one attribute. The request's size is
    `protocols.http.max_request_body_size` / `protocols.grpc.max_recv_msg_size_mib`, both after decompression."""

    max_attribute_value_length: int = MIB  # bytes of a string / bytes value (each element of an array or map too)
    max_attributes_per_span: int = 1024  # also of each event, each link and the resource of spans
    max_events_per_span: int = 1024
    max_links_per_span: int = 1024
    max_attributes_per_log_record: int = 1024  # also of the resource of log records
    max_spans_per_request: int = 100_000
    max_log_records_per_request: int = 100_000

    _not_bool = field_validator("*", mode="before")(not_bool)
    _check = field_validator("*")(at_least_one)


class Protocols(ComponentConfig):
    """As in otelcol: a protocol listed (even with no body) is enabled; one left out is off."""

    grpc: GrpcConfig | None = None
    http: HttpConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _listed_means_enabled(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: ({} if v is None else v) for k, v in data.items()}
        return data


class OtlpReceiverConfig(ComponentConfig):
    # no `protocols` at all: both, on their default loopback endpoints
    protocols: Protocols = Protocols(grpc=GrpcConfig(), http=HttpConfig())
    limits: Limits = Limits()

    def listeners(self) -> dict[str, str]:
        """The endpoints this receiver listens on, by key path (for the `auth` rule on reachable listeners)."""
        p = self.protocols
        found = {"protocols.grpc.endpoint": p.grpc.endpoint} if p.grpc else {}
        return found | ({"protocols.http.endpoint": p.http.endpoint} if p.http else {})

    @model_validator(mode="after")
    def _one_protocol(self) -> OtlpReceiverConfig:
        if self.protocols.grpc is None and self.protocols.http is None:
            raise ValueError("protocols: enable at least one of grpc, http")
        return self
