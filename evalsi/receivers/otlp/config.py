"""Config of the OTLP receiver: which protocols listen where, and how large a request may be."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator, model_validator

from evalsi.component import ComponentConfig
from evalsi.serving import parse_endpoint

MIB = 1024 * 1024


def _endpoint(value: str) -> str:
    parse_endpoint(value)
    return value


class GrpcConfig(ComponentConfig):
    endpoint: str = "127.0.0.1:4317"
    max_recv_msg_size_mib: int = 20

    _check_endpoint = field_validator("endpoint")(_endpoint)


class HttpConfig(ComponentConfig):
    endpoint: str = "127.0.0.1:4318"
    max_request_body_size: int = 20 * MIB
    traces_url_path: str = "/v1/traces"
    logs_url_path: str = "/v1/logs"

    _check_endpoint = field_validator("endpoint")(_endpoint)


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
