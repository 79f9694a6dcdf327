"""Who may send and read: the `auth` section, API keys checked (as sha256 hashes) on every listener, and the rule
that a listener reachable from other machines needs an `auth` section."""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evalsi.serving import parse_endpoint
from evalsi.telemetry import SelfMetrics

KEY_PREFIX = "evk_"
HASH_PREFIX = "sha256:"
Surface = Literal["otlp", "api", "metrics"]
"""What a listener serves: OTLP ingest, the query API (evaluate and feedback included), or Prometheus metrics."""


class ApiKeyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hash: str
    """`sha256:<64 hex>` of the key (`evalsi keys new` prints both); the key itself is never in the config."""
    name: str = ""
    """Whose key it is, for the logs (never the key)."""

    @field_validator("hash")
    @classmethod
    def _hash(cls, v: str) -> str:
        hexpart = v.removeprefix(HASH_PREFIX)
        if not v.startswith(HASH_PREFIX) or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
            shown = v[:12] + "…" if len(v) > 12 else v
            if v.startswith(KEY_PREFIX):
                shown = KEY_PREFIX + "…"
            raise ValueError(
                f"{shown!r} is not a key hash: write `sha256:` and 64 lowercase hex digits, as `evalsi keys new` "
                "prints (the config holds the hash, never the key)"
            )
        return v


class AuthConfig(BaseModel):
    """The `auth` section. `strict`: every request needs a key; `optional`: a request without one is taken, a wrong
    one refused; `none`: anyone may send and read (logged as a warning at every start)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["strict", "optional", "none"] = "strict"
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    metrics: Literal["protected", "open"] = "protected"
    """`protected`: /metrics needs a key unless its listener is on loopback; `open`: never (Prometheus scrapes in a
    private network). Metrics carry counts and policy names, never trace content."""

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, keys: list[ApiKeyConfig], info: ValidationInfo) -> list[ApiKeyConfig]:
        mode = info.data.get("mode", "strict")
        if mode != "none" and not keys:
            raise ValueError(
                f"mode {mode} with no key refuses everyone: add one (`evalsi keys new` prints a key and its hash), "
                "or set `mode: none` to accept anyone"
            )
        if mode == "none" and keys:
            raise ValueError("mode none checks no key: remove the keys, or set `mode: strict`")
        hashes = [k.hash for k in keys]
        if len(set(hashes)) != len(hashes):
            raise ValueError("the same hash is listed twice")
        return keys

    @model_validator(mode="before")
    @classmethod
    def _keys_checked(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_keys" not in data:
            data = {**data, "api_keys": []}  # so the field's check runs when the key is left out
        return data


def new_key() -> tuple[str, str]:
    """A fresh API key and its `sha256:` hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_of(key)


def hash_of(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


KEY_ENV = "EVALSI_API_KEY"


def api_headers() -> dict[str, str]:
    """What evalsi's own clients (the CLI, `evalsi run`) send to a collector: the key in `EVALSI_API_KEY`, if set."""
    import os

    key = os.environ.get(KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def without_password(url: str) -> str:
    """`url` as it may be logged: a password in it (`scheme://user:password@host`) shown as ***."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@") if sep else ("", "", rest)
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def is_loopback(endpoint: str) -> bool:
    """Whether only this machine can reach a listener on `endpoint` (127.0.0.0/8, ::1, localhost)."""
    host, _ = parse_endpoint(endpoint)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: resolved at bind, possibly to a public address


class Unauthenticated(Exception):
    """A request without a valid key where one is needed; the message says what to send."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name, or anonymous (optional mode, or a listener that needs no key)."""

    name: str = ""
    authenticated: bool = False


ANONYMOUS = Caller()


class Authenticator:
    """Checks the `Authorization: Bearer <key>` of a request against the configured hashes."""

    def __init__(self, config: AuthConfig, metrics: SelfMetrics | None = None) -> None:
        self.config = config
        self._keys = {bytes.fromhex(k.hash.removeprefix(HASH_PREFIX)): k.name for k in config.api_keys}
        self._refused = (
            metrics.counter(
                "evalsi_auth_refused_requests",
                "Requests refused for their credentials, by listener (otlp_http, otlp_grpc, api, metrics, "
                "prometheus) and reason (missing, malformed, unknown key).",
                ["surface", "reason"],
            )
            if metrics is not None
            else None
        )
        self._anonymous = (
            metrics.counter(
                "evalsi_auth_anonymous_requests",
                "Requests taken without a key (mode optional), by listener: what still needs a key before strict.",
                ["surface"],
            )
            if metrics is not None
            else None
        )

    @property
    def enabled(self) -> bool:
        return self.config.mode != "none"

    def needs_key(self, surface: Surface, endpoint: str) -> bool:
        if surface == "metrics":
            return self.enabled and self.config.metrics == "protected" and not is_loopback(endpoint)
        return self.enabled

    def check(self, authorization: str | None, surface: str = "") -> Caller:
        """The caller of a request with this `Authorization` value; raises `Unauthenticated`. `surface` names the
        listener in the refusal counts."""
        if not authorization:
            if self.config.mode == "strict":
                raise self._refuse(
                    surface, "missing", "this endpoint needs an API key: send `Authorization: Bearer evk_…`"
                )
            if self._anonymous is not None:
                self._anonymous.labels(surface).inc()
            return ANONYMOUS
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise self._refuse(surface, "malformed", "the Authorization header must be `Bearer <API key>`")
        # a lookup by the key's digest: comparing digests leaks nothing useful about the key through timing
        name = self._keys.get(hashlib.sha256(token.strip().encode()).digest())
        if name is None:
            raise self._refuse(
                surface, "unknown key", "the API key is not valid here: check it, or ask for one (`evalsi keys new`)"
            )
        return Caller(name, authenticated=True)

    def _refuse(self, surface: str, reason: str, message: str) -> Unauthenticated:
        if self._refused is not None:
            self._refused.labels(surface, reason).inc()
        return Unauthenticated(message)


# --- HTTP (ASGI) -----------------------------------------------------------------------------------------------

Refusal = Callable[[dict[str, Any], str], tuple[int, list[tuple[bytes, bytes]], bytes]]
"""Builds the 401 a surface answers: (status, headers, body) for the request's scope and the message."""


def json_refusal(scope: dict[str, Any], message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    import json

    return 401, [(b"content-type", b"application/json")], json.dumps({"detail": message}).encode()


def gate(
    app: Any, auth: Authenticator | None, *, surface: str, open_paths: Iterable[str] = (),
    refusal: Refusal = json_refusal,
) -> Any:  # fmt: skip
    """`app` behind a key check (none when `auth` is None or in mode none); `open_paths` (health) stay open."""
    if auth is None or not auth.enabled:
        return app
    always_open = frozenset(open_paths)

    async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") in always_open:
            await app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        try:
            auth.check(header.decode("latin-1") if header is not None else None, surface)
        except Unauthenticated as e:
            status, headers, body = refusal(scope, str(e))
            headers = [*headers, (b"www-authenticate", b'Bearer realm="evalsi"'), (b"content-length",
                       str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return gated


# --- gRPC -------------------------------------------------------------------------------------------------------


class GrpcKeyCheck(grpc.aio.ServerInterceptor):
    """Refuses an RPC without a valid key in its `authorization` metadata with UNAUTHENTICATED."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        metadata = dict(details.invocation_metadata or ())  # type: ignore[attr-defined]
        value = metadata.get("authorization")
        try:
            self._auth.check(value if isinstance(value, str) else None, "otlp_grpc")
        except Unauthenticated as e:
            message = str(e)

            async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
                return b""

            return grpc.unary_unary_rpc_method_handler(refuse)
        return await continuation(details)
