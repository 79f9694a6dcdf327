"""Who may send and read: the `auth` section, API keys checked (as sha256 hashes) and JWT bearer tokens checked
(against an issuer's public keys) on every listener, the principal (who, and which project) of each request, and the
rule that a listener reachable from other machines needs an `auth` section."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evalsi.duration import Duration
from evalsi.ports import parse_endpoint
from evalsi.span import DEFAULT_PROJECT
from evalsi.telemetry import SelfMetrics

log = logging.getLogger("evalsi.auth")

KEY_PREFIX = "evk_"
HASH_PREFIX = "sha256:"
Surface = Literal["otlp", "api", "metrics"]
"""What a listener serves: OTLP ingest, the query API (evaluate and feedback included), or Prometheus metrics."""

PROJECT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""A project name: lowercase letters, digits, `_` and `-`, starting with a letter or a digit, at most 63 characters."""

# what `auth.jwt.algorithms` may list: signatures checked with a public key, so the config holds nothing secret
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES256K", "ES384", "ES512",
                         "EdDSA")  # fmt: skip
JWKS_MIN_INTERVAL = 60.0
"""Seconds between two loads of the JWKS at least, whatever asks for one (its refresh, a token with a new `kid`, a
load that failed)."""
JWKS_MAX_BYTES = 1 << 20
JWKS_TIMEOUT = 5.0


def _project_name(value: str) -> str:
    if not PROJECT_PATTERN.fullmatch(value):
        shown = value if len(value) <= 70 else value[:70] + "…"
        raise ValueError(
            f"{shown!r} is not a project name: lowercase letters, digits, `_` and `-`, starting with a letter or a "
            "digit, at most 63 characters"
        )
    return value


class ApiKeyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hash: str
    """`sha256:<64 hex>` of the key (`evalsi keys new` prints both); the key itself is never in the config."""
    name: str = ""
    """Whose key it is, for the logs (never the key)."""
    project: str = DEFAULT_PROJECT
    """The project a request with this key is for (see `Principal`)."""

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

    @field_validator("project")
    @classmethod
    def _project(cls, v: str) -> str:
        return _project_name(v)


def _loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class JwtConfig(BaseModel):
    """`auth.jwt`: bearer tokens signed by an issuer (an OIDC provider, a token service), checked against its public
    keys (a JWKS, from a file or a URL)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jwks_file: Path | None = None
    """A JWKS (JSON Web Key Set) file holding the issuer's public keys."""
    jwks_url: str | None = None
    """The issuer's JWKS endpoint (https; http only on a loopback host), fetched at the first token."""
    jwks_refresh: Duration = 300.0
    """How often the JWKS is loaded again; a token naming a key (`kid`) it lacks loads it sooner (once a minute at
    most)."""
    issuer: str
    """The `iss` a token must carry."""
    audience: str | list[str]
    """The `aud` a token must carry (one of them, when a list)."""
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    """The signature algorithms taken; asymmetric only."""
    leeway: Duration = 30.0
    """Clock skew allowed on `exp`, `nbf` and `iat`."""
    project_claim: str = "evalsi_project"
    """The claim that names the token's project."""
    name_claim: str = "sub"
    """The claim that names who holds the token (for the logs)."""
    default_project: str | None = None
    """The project of a token without `project_claim`; unset, such a token is refused."""

    @field_validator("jwks_file")
    @classmethod
    def _jwks_file(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return None
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        path = (Path(base) / v if base is not None and not v.is_absolute() else v).absolute()
        read_jwks_file(path)  # a ValueError saying what is wrong with it
        return path

    @field_validator("jwks_url")
    @classmethod
    def _jwks_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        shown = without_password(v)
        try:
            parts = urlsplit(v)
            host = parts.hostname or ""
        except ValueError:
            raise ValueError(f"{shown!r} is not a URL") from None
        if parts.scheme not in ("https", "http") or not host:
            raise ValueError(f"{shown!r} is not an https URL (https://issuer.example.com/.well-known/jwks.json)")
        if parts.scheme == "http" and not _loopback_host(host):
            raise ValueError(
                f"{shown} is plain http: the keys that every token is checked against must come over https (http is "
                "taken only from a loopback host: 127.0.0.1, ::1, localhost)"
            )
        return v

    @field_validator("jwks_refresh")
    @classmethod
    def _refresh(cls, v: float) -> float:
        if v < JWKS_MIN_INTERVAL:
            raise ValueError(f"at least 1m: the JWKS is loaded once a minute at most (got {v:g}s)")
        return v

    @field_validator("issuer", "project_claim", "name_claim")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("audience")
    @classmethod
    def _audience(cls, v: str | list[str]) -> str | list[str]:
        values = [v] if isinstance(v, str) else v
        if not values or not all(a.strip() for a in values):
            raise ValueError("must not be empty: the `aud` a token is issued for (this collector's)")
        return v

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"list one algorithm at least ({', '.join(ASYMMETRIC_ALGORITHMS)})")
        for alg in v:
            if alg.lower() == "none":
                raise ValueError(
                    "`none` is an unsigned token: anyone could write one that passes. List signature algorithms "
                    "(RS256, ES256, ...)"
                )
            if alg.upper().startswith("HS"):
                raise ValueError(
                    f"{alg} is symmetric (HMAC): the key that checks a token also signs one, so it would need a "
                    "shared secret in the config, and whoever reads the config could mint tokens. Use an asymmetric "
                    f"algorithm ({', '.join(ASYMMETRIC_ALGORITHMS)})"
                )
            if alg not in ASYMMETRIC_ALGORITHMS:
                raise ValueError(
                    f"{alg!r} is not an algorithm evalsi checks (known: {', '.join(ASYMMETRIC_ALGORITHMS)})"
                )
        if len(set(v)) != len(v):
            raise ValueError("an algorithm is listed twice")
        return v

    @field_validator("default_project")
    @classmethod
    def _default_project(cls, v: str | None) -> str | None:
        return None if v is None else _project_name(v)

    @model_validator(mode="after")
    def _one_source(self) -> JwtConfig:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError(
                "give exactly one of `jwks_file` (a JWKS file) or `jwks_url` (the issuer's JWKS endpoint)"
                + (", not both" if self.jwks_file is not None else "")
            )
        return self


class AuthConfig(BaseModel):
    """The `auth` section. `strict`: every request needs a key or a token; `optional`: a request without one is
    taken, a wrong one refused; `none`: anyone may send and read (logged as a warning at every start)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["strict", "optional", "none"] = "strict"
    jwt: JwtConfig | None = None
    """Bearer tokens (JWTs) from an issuer, taken beside the API keys."""
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    metrics: Literal["protected", "open"] = "protected"
    """`protected`: /metrics needs a key unless its listener is on loopback; `open`: never (Prometheus scrapes in a
    private network). Metrics carry counts and policy names, never trace content."""

    @field_validator("jwt")
    @classmethod
    def _jwt(cls, jwt: JwtConfig | None, info: ValidationInfo) -> JwtConfig | None:
        if jwt is not None and info.data.get("mode") == "none":
            raise ValueError("mode none checks no bearer token: remove `jwt`, or set `mode: strict`")
        return jwt

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, keys: list[ApiKeyConfig], info: ValidationInfo) -> list[ApiKeyConfig]:
        mode = info.data.get("mode", "strict")
        if mode != "none" and not keys and info.data.get("jwt") is None:
            raise ValueError(
                f"mode {mode} with no key refuses everyone: add one (`evalsi keys new` prints a key and its hash), "
                "or a `jwt` section to take an issuer's tokens, or set `mode: none` to accept anyone"
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
        if not isinstance(data, dict):
            return data
        if data.get("jwt") is not None:
            # tokens instead of keys: no key is fine (and a `jwt` with a mistake is reported alone, not again as
            # "no key")
            if data.get("api_keys") == []:
                data = {k: v for k, v in data.items() if k != "api_keys"}
        elif "api_keys" not in data:
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
    return _loopback_host(host)  # a host name is not: resolved at bind, possibly to a public address


# --- principals and refusals ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Principal:
    """Who sent a request and for which project: the key's name (or the token's `name_claim`), the credential's
    project, and what it came with. Anonymous: no credential (mode optional)."""

    name: str
    project: str
    via: Literal["api_key", "jwt", "anonymous"]


ANONYMOUS_PRINCIPAL = Principal("anonymous", DEFAULT_PROJECT, "anonymous")


class Unauthenticated(Exception):
    """A request without a valid key where one is needed; the message says what to send."""


class Refusal(Unauthenticated):
    """A request refused for its credentials: `reason` (a label of `evalsi_auth_refused_requests_total`) and a
    message for the sender, which never quotes the credential.

    Reasons: `missing`, `malformed`, `unknown key` (an API key not listed); for a JWT `invalid` (not a JWT, a bad
    signature), `expired`, `not_yet_valid`, `wrong_audience`, `wrong_issuer`, `missing_claim`,
    `algorithm_not_allowed`, `unknown_kid`, `jwks_unavailable` (the issuer's keys could not be loaded), `no_project`,
    `bad_project`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name, or anonymous (optional mode, or a listener that needs no key)."""

    name: str = ""
    authenticated: bool = False


ANONYMOUS = Caller()


# --- the issuer's keys ------------------------------------------------------------------------------------------


def parse_jwks(doc: Any) -> list[dict[str, Any]]:
    """The signing keys of a JWKS document (`{"keys": [...]}`), as JWK objects evalsi can check a signature with;
    a ValueError saying what is wrong (a private or symmetric key, no usable key)."""
    from jwt import PyJWK
    from jwt.exceptions import PyJWTError

    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError('not a JWKS: a JSON object with a "keys" list')
    usable = []
    for i, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            raise ValueError(f"key {i} is not a JSON object")
        if jwk.get("kty") == "oct":
            raise ValueError(f"key {i} is symmetric (kty oct): list the issuer's public keys only")
        if any(part in jwk for part in ("d", "p", "q")):
            raise ValueError(f"key {i} holds a private key: list the issuer's public keys only")
        if jwk.get("use", "sig") != "sig":
            continue  # an encryption key
        try:
            PyJWK(jwk)  # type: ignore[arg-type]
        except PyJWTError:
            continue  # a key type this evalsi cannot check (the issuer may publish several)
        usable.append(jwk)
    if not usable:
        raise ValueError("holds no signing key evalsi can use (RSA, EC or Ed25519 public keys)")
    return usable


def read_jwks_file(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} cannot be read: {type(e).__name__}: {e}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    try:
        return parse_jwks(doc)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@dataclass
class _KeySet:
    keys: list[dict[str, Any]]
    by_kid: dict[str, dict[str, Any]] = field(default_factory=dict)
    prepared: dict[tuple[int, str], Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for jwk in self.keys:
            if isinstance(jwk.get("kid"), str):
                self.by_kid.setdefault(jwk["kid"], jwk)

    def key(self, jwk: dict[str, Any], alg: str) -> Any:
        """`jwk` as the PyJWK that checks an `alg` signature: its own `alg` when it names one (a mismatch is refused),
        else `alg` (an RSA key serves RS* and PS* alike)."""
        from jwt import PyJWK
        from jwt.exceptions import PyJWTError

        slot = (id(jwk), alg)
        if slot not in self.prepared:
            try:
                self.prepared[slot] = PyJWK(jwk) if "alg" in jwk else PyJWK(jwk, algorithm=alg)  # type: ignore[arg-type]
            except PyJWTError:
                self.prepared[slot] = PyJWK(jwk)  # type: ignore[arg-type]  # parsed once already: the alg did not fit
        return self.prepared[slot]


class Jwks:
    """The issuer's public keys (`auth.jwt.jwks_file` or `jwks_url`): loaded at first use, again every
    `jwks_refresh` and when a token names a key (`kid`) they lack; at most once a minute whatever asks. A load that
    fails keeps the keys there were (and is logged)."""

    def __init__(self, config: JwtConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.source = str(config.jwks_file) if config.jwks_file is not None else without_password(config.jwks_url or "")
        self.loads = 0
        """Loads that succeeded (for tests and logs)."""
        self._lock = threading.Lock()
        self._set: _KeySet | None = None
        self._loaded_at = 0.0
        self._tried_at: float | None = None

    def due(self, kid: str | None) -> bool:
        """Whether finding `kid` would load the keys now (a file read or an HTTP request)."""
        now = self.clock()
        if self._tried_at is not None and now - self._tried_at < JWKS_MIN_INTERVAL:
            return False
        keys = self._set
        if keys is None or now - self._loaded_at >= self.config.jwks_refresh:
            return True
        return kid is not None and kid not in keys.by_kid

    def find(self, kid: str | None, alg: str) -> Any:
        """The key (a PyJWK) that checks a token naming `kid`, signed with `alg`; raises `Refusal`."""
        if self.due(kid):
            with self._lock:
                if self.due(kid):
                    self._load()
        keys = self._set
        if keys is None:
            raise Refusal("jwks_unavailable", "the issuer's signing keys could not be loaded: try again in a minute")
        if kid is None:
            if len(keys.keys) != 1:
                raise Refusal("unknown_kid", "the token names no signing key (`kid`) and the issuer has several")
            return keys.key(keys.keys[0], alg)
        jwk = keys.by_kid.get(kid)
        if jwk is None:
            raise Refusal("unknown_kid", "the token is signed with a key (its `kid`) the issuer does not list")
        return keys.key(jwk, alg)

    def _load(self) -> None:
        self._tried_at = self.clock()
        try:
            if self.config.jwks_file is not None:
                keys = read_jwks_file(self.config.jwks_file)
            else:
                keys = parse_jwks(json.loads(self._fetch(self.config.jwks_url or "")))
        except (ValueError, OSError) as e:  # `_fetch` turns httpx's errors into ValueErrors
            log.warning(
                "could not load the JWKS; keeping the keys loaded before (if any)",
                extra={"source": self.source, "error": str(e)[:300], "had_keys": self._set is not None},
            )
            return
        self._set = _KeySet(keys)
        self._loaded_at = self._tried_at
        self.loads += 1
        log.info("JWKS loaded", extra={"source": self.source, "keys": len(keys)})

    @staticmethod
    def _fetch(url: str) -> bytes:
        import httpx

        try:
            with httpx.Client(timeout=JWKS_TIMEOUT, follow_redirects=False) as client, client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise ValueError(f"HTTP {r.status_code}")
                body = b""
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > JWKS_MAX_BYTES:
                        raise ValueError(f"larger than {JWKS_MAX_BYTES} bytes")
                return body
        except httpx.HTTPError as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None


# --- the check ----------------------------------------------------------------------------------------------------


def _is_jwt(token: str) -> bool:
    """Whether a bearer value is a JWT (three base64url parts) rather than an API key (`evk_…`, no dots)."""
    return token.count(".") == 2


class Authenticator:
    """Checks the `Authorization: Bearer <credential>` of a request: an API key against the configured hashes, a JWT
    against the issuer's keys (`auth.jwt`); `identify` says who it is."""

    def __init__(
        self, config: AuthConfig, metrics: SelfMetrics | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._keys = {
            bytes.fromhex(k.hash.removeprefix(HASH_PREFIX)): Principal(
                k.name or k.hash[: len(HASH_PREFIX) + 12], k.project, "api_key"
            )
            for k in config.api_keys
        }
        self.jwks = Jwks(config.jwt, clock) if config.jwt is not None and self.enabled else None
        self._refused = (
            metrics.counter(
                "evalsi_auth_refused_requests",
                "Requests refused for their credentials, by listener (otlp_http, otlp_grpc, api, metrics, "
                "prometheus) and reason (missing, malformed, unknown key; for a JWT invalid, expired, not_yet_valid, "
                "wrong_audience, wrong_issuer, missing_claim, algorithm_not_allowed, unknown_kid, jwks_unavailable, "
                "no_project, bad_project).",
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

    def identify(self, authorization: str | None, surface: str | None = None) -> Principal:
        """The principal of a request with this `Authorization` value (`Bearer <API key or JWT>`); raises `Refusal`.
        `surface` names the listener in the refusal and anonymous counts (left out, the request is not counted: it
        was counted where it came in). Mode none: everyone is anonymous."""
        try:
            principal = self._identify(authorization)
        except Refusal as e:
            if self._refused is not None and surface is not None:
                self._refused.labels(surface, e.reason).inc()
            raise
        if principal.via == "anonymous" and self._anonymous is not None and surface is not None and self.enabled:
            self._anonymous.labels(surface).inc()
        return principal

    async def identify_async(self, authorization: str | None, surface: str | None = None) -> Principal:
        """`identify` for an event loop: a check that would load the issuer's keys (an HTTP request) runs in a
        thread."""
        if self.jwks is not None and authorization and self.jwks.due(self._kid_of(authorization)):
            return await asyncio.to_thread(self.identify, authorization, surface)
        return self.identify(authorization, surface)

    def check(self, authorization: str | None, surface: str = "") -> Caller:
        """The caller of a request with this `Authorization` value; raises `Unauthenticated` (a `Refusal`).
        `surface` names the listener in the refusal counts. Kept for callers that need no project: see `identify`."""
        principal = self.identify(authorization, surface)
        if principal.via == "anonymous":
            return ANONYMOUS
        return Caller(principal.name, authenticated=True)

    def _credentials(self) -> tuple[str, str, str]:
        """What this collector takes: in words, as an example header value, and as the header's form."""
        if self.jwks is None:
            return "an API key", "Bearer evk_…", "Bearer <API key>"
        if not self._keys:
            return "a token (JWT)", "Bearer <JWT>", "Bearer <JWT>"
        return "an API key or a token (JWT)", "Bearer evk_…` or `Bearer <JWT>", "Bearer <API key or JWT>"

    def _identify(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS_PRINCIPAL
        if not authorization:
            if self.config.mode == "strict":
                words, example, _ = self._credentials()
                raise Refusal("missing", f"this endpoint needs {words}: send `Authorization: {example}`")
            return ANONYMOUS_PRINCIPAL
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Refusal("malformed", f"the Authorization header must be `{self._credentials()[2]}`")
        if self.jwks is not None and _is_jwt(token):
            return self._from_jwt(token)
        # a lookup by the key's digest: comparing digests leaks nothing useful about the key through timing
        principal = self._keys.get(hashlib.sha256(token.encode()).digest())
        if principal is None:
            if not self._keys and self.jwks is not None:
                raise Refusal("unknown key", "this collector takes tokens (JWT) only, and the bearer value is not one")
            raise Refusal("unknown key", "the API key is not valid here: check it, or ask for one (`evalsi keys new`)")
        return principal

    @staticmethod
    def _kid_of(authorization: str) -> str | None:
        import jwt

        _, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if not _is_jwt(token):
            return None
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            return None
        return kid if isinstance(kid, str) else None

    def _from_jwt(self, token: str) -> Principal:
        import jwt
        from jwt import exceptions as e

        config = self.config.jwt
        assert config is not None and self.jwks is not None
        try:
            header = jwt.get_unverified_header(token)
        except e.PyJWTError:
            raise Refusal("invalid", "the bearer token is not a well-formed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in config.algorithms:
            raise Refusal(
                "algorithm_not_allowed",
                f"the token's signature algorithm is not taken here (taken: {', '.join(config.algorithms)})",
            )
        if kid is not None and not isinstance(kid, str):
            raise Refusal("invalid", "the token's `kid` is not a string")
        key = self.jwks.find(kid, alg)
        try:
            claims = jwt.decode(
                token, key, algorithms=config.algorithms, audience=config.audience, issuer=config.issuer,
                leeway=config.leeway, options={"require": ["exp", "iss", "aud"]},
            )  # fmt: skip
        except e.ExpiredSignatureError:
            raise Refusal("expired", "the token has expired: get a new one from its issuer") from None
        except e.MissingRequiredClaimError as missing:
            raise Refusal("missing_claim", f"the token has no `{missing.claim}` claim, which evalsi requires") from None
        except e.InvalidAudienceError:
            raise Refusal("wrong_audience", "the token was not issued for this collector (its `aud`)") from None
        except e.InvalidIssuerError:
            raise Refusal(
                "wrong_issuer", "the token is not from the issuer this collector trusts (its `iss`)"
            ) from None
        except e.ImmatureSignatureError:
            raise Refusal("not_yet_valid", "the token is not valid yet (its `nbf` or `iat`)") from None
        except (e.PyJWTError, ValueError, TypeError):
            raise Refusal("invalid", "the token's signature or claims are not valid") from None
        name = claims.get(config.name_claim)
        if not isinstance(name, str) or not name:
            raise Refusal("missing_claim", f"the token has no `{config.name_claim}` claim naming who holds it")
        project = claims.get(config.project_claim)
        if project is None:
            if config.default_project is None:
                raise Refusal(
                    "no_project",
                    f"the token has no `{config.project_claim}` claim naming its project (and no "
                    "`auth.jwt.default_project` is set)",
                )
            project = config.default_project
        if not isinstance(project, str) or not PROJECT_PATTERN.fullmatch(project):
            raise Refusal(
                "bad_project",
                f"the token's `{config.project_claim}` claim is not a project name (lowercase letters, digits, `_`, "
                "`-`)",
            )
        return Principal(name, project, "jwt")


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


# --- HTTP (ASGI) -----------------------------------------------------------------------------------------------

PRINCIPAL_SCOPE_KEY = "evalsi.principal"

RefusalAnswer = Callable[[dict[str, Any], str], tuple[int, list[tuple[bytes, bytes]], bytes]]
"""Builds the 401 a surface answers: (status, headers, body) for the request's scope and the message."""


def json_refusal(scope: dict[str, Any], message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return 401, [(b"content-type", b"application/json")], json.dumps({"detail": message}).encode()


def gate(
    app: Any, auth: Authenticator | None, *, surface: str, open_paths: Iterable[str] = (),
    refusal: RefusalAnswer = json_refusal,
) -> Any:  # fmt: skip
    """`app` behind a credential check; `open_paths` (health) stay open. Every HTTP request the app sees carries its
    `Principal` in `scope["evalsi.principal"]` (anonymous on an open path, with no `auth`, or in mode none)."""
    if auth is None or not auth.enabled:

        async def anonymous(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http":
                scope[PRINCIPAL_SCOPE_KEY] = ANONYMOUS_PRINCIPAL
            await app(scope, receive, send)

        return anonymous
    always_open = frozenset(open_paths)

    async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") in always_open:
            if scope.get("type") == "http":
                scope[PRINCIPAL_SCOPE_KEY] = ANONYMOUS_PRINCIPAL
            await app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        try:
            principal = await auth.identify_async(header.decode("latin-1") if header is not None else None, surface)
        except Refusal as e:
            status, headers, body = refusal(scope, str(e))
            headers = [*headers, (b"www-authenticate", b'Bearer realm="evalsi"'), (b"content-length",
                       str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await app(scope, receive, send)

    return gated


# --- gRPC -------------------------------------------------------------------------------------------------------


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
