"""The `auth` section of a config: API keys (their hashes), JWT issuers, the mode, and whether /metrics needs a key; and
the rule that a listener reachable from other machines needs a key (`is_loopback`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evalsi.auth.jwks import JWKS_MIN_INTERVAL, read_jwks_file
from evalsi.auth.keys import HASH_PREFIX, KEY_PREFIX, without_password
from evalsi.auth.principal import PROJECT_PATTERN
from evalsi.duration import Duration
from evalsi.model.span import DEFAULT_PROJECT
from evalsi.runtime.ports import parse_endpoint

# what `auth.jwt.algorithms` may list: signatures checked with a public key, so the config holds nothing secret
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES256K", "ES384", "ES512",
                         "EdDSA")  # fmt: skip


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


def is_loopback(endpoint: str) -> bool:
    """Whether only this machine can reach a listener on `endpoint` (127.0.0.0/8, ::1, localhost)."""
    host, _ = parse_endpoint(endpoint)
    return _loopback_host(host)  # a host name is not: resolved at bind, possibly to a public address
