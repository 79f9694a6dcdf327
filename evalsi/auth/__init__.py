"""Who may send and read: the `auth` section (`config`), API keys (`keys`), the issuer's public keys for JWT bearer
tokens (`jwks`), the check of each request's credential (`authenticator`), and the gates in front of the HTTP
(`asgi_gate`) and gRPC (`grpc_gate`) listeners; each request's `Principal` (who, and which project) in `principal`.

The gRPC gate's names are exported lazily: a pipeline worker imports `evalsi.auth` but never serves gRPC, and
importing grpc costs a process ~8 MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalsi.auth.asgi_gate import PRINCIPAL_SCOPE_KEY, RefusalAnswer, gate, json_refusal
from evalsi.auth.authenticator import Authenticator
from evalsi.auth.config import ASYMMETRIC_ALGORITHMS, ApiKeyConfig, AuthConfig, JwtConfig, is_loopback
from evalsi.auth.jwks import (
    JWKS_MAX_BYTES,
    JWKS_MIN_INTERVAL,
    JWKS_TIMEOUT,
    Jwks,
    JwksSource,
    parse_jwks,
    read_jwks_file,
)
from evalsi.auth.keys import HASH_PREFIX, KEY_ENV, KEY_PREFIX, api_headers, hash_of, new_key, without_password
from evalsi.auth.principal import (
    ANONYMOUS,
    ANONYMOUS_PRINCIPAL,
    PROJECT_PATTERN,
    Caller,
    Principal,
    Refusal,
    Surface,
    Unauthenticated,
)
from evalsi.runtime.lazy import lazy_exports

__all__ = [
    "ANONYMOUS", "ANONYMOUS_PRINCIPAL", "ASYMMETRIC_ALGORITHMS", "HASH_PREFIX", "JWKS_MAX_BYTES", "JWKS_MIN_INTERVAL",
    "JWKS_TIMEOUT", "KEY_ENV", "KEY_PREFIX", "PRINCIPAL_SCOPE_KEY", "PROJECT_PATTERN", "ApiKeyConfig", "AuthConfig",
    "Authenticator", "Caller", "GrpcKeyCheck", "Jwks", "JwksSource", "JwtConfig", "Principal", "Refusal",
    "RefusalAnswer", "Surface", "Unauthenticated", "api_headers", "gate", "hash_of", "is_loopback", "json_refusal",
    "new_key", "parse_jwks", "principal_from_metadata", "read_jwks_file", "without_password",
]  # fmt: skip

if TYPE_CHECKING:
    from evalsi.auth.grpc_gate import GrpcKeyCheck, principal_from_metadata

_LAZY = {"GrpcKeyCheck": "grpc_gate", "principal_from_metadata": "grpc_gate"}

__getattr__ = lazy_exports(__name__, _LAZY)
