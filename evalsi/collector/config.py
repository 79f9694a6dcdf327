"""The collector config: YAML, `env:` values, every component validated, every error naming its key path."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, unquote

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evalsi.auth.config import AuthConfig, is_loopback
from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, SIGNALS, ComponentConfig, Kind
from evalsi.duration import Duration
from evalsi.env_vars import unset_variable
from evalsi.limits import MIB, at_least_one, not_bool
from evalsi.runtime.ports import API_ENDPOINT, METRICS_ADDRESS
from evalsi.wal import DurabilityConfig


class ConfigError(Exception):
    """Every problem found in a config, each as `key.path: what is wrong`; never a credential (see `redact`):
    `secrets` are the config's secret values (and those of secret-named environment variables, which `env:`
    references bring in), which a message quoting a value may hold."""

    def __init__(self, errors: list[str], source: str = "", secrets: Iterable[str] = ()) -> None:
        # 8 characters at least: TOKENIZERS_PARALLELISM=false must not hide every "false"
        known = set(secrets) | {v for k, v in os.environ.items() if len(v) >= 8 and _SECRET_KEY.fullmatch(k)}
        self.errors = [redact(e, known) for e in errors]
        self.source = source
        head = f"invalid config {source}" if source else "invalid config"
        super().__init__(head + ":\n" + "\n".join(f"  {e}" for e in self.errors))


# a key whose value is a credential (`api_keys` is a list of key hashes, not keys); `headers` values all count
_SECRET_KEY = re.compile(
    r"[\w-]*(?:password|passwd|secret|token(?!s)|api[_-]?key(?!s)|apikey|authorization|credential|private[_-]?key"
    r"|hmac[_-]?key|bearer|cookie)[\w-]*",
    re.I,
)
_SECRET_CONTAINER = re.compile(r"headers?", re.I)
# scheme://user:password@host: the password runs to the last @ before a space or a quote (it may hold an @)
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):(?P<password>[^\s'\"]*)@")
# `password: value` or `token=value` as YAML lines or free text quote them (not `a.b.password: message`, a key path)
_SECRET_PAIR = re.compile(
    rf"(?P<key>(?<![\w.])(?:{_SECRET_KEY.pattern})[\"']?\s*[:=][ \t]*)(?P<value>(?!\*\*\*)[^\s][^\n]*)", re.I
)
REDACTED = "***"


def secret_values(doc: Any, secret: bool = False) -> set[str]:
    """The credentials a config document holds: values of secret-named keys (and of `headers`), and the password
    of every URL with one, so that a message quoting any of them can be redacted."""
    found: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            name = str(k)
            found |= secret_values(v, secret or bool(_SECRET_KEY.fullmatch(name) or _SECRET_CONTAINER.fullmatch(name)))
    elif isinstance(doc, list):
        for v in doc:
            found |= secret_values(v, secret)
    elif isinstance(doc, str):
        if secret and doc:
            found.add(doc)
        for m in _URL_USERINFO.finditer(doc):
            if m.group("password"):
                found.update((m.group("password"), unquote(m.group("password"))))
    return found


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with no credential: the known `secrets` (as written, quoted or URL-encoded), every URL's password
    (`user:***@`) and the value of every `password: …` or `token=…` it quotes become ***."""
    for value in sorted(set(secrets), key=len, reverse=True):
        forms = {value, repr(value)[1:-1], quote(value, safe="")}
        for form in sorted(forms, key=len, reverse=True):
            if len(form) >= 4:
                text = text.replace(form, REDACTED)
            else:  # a short one only where it stands quoted alone: "abc" would otherwise hide every abc
                text = re.sub(rf"(['\"]){re.escape(form)}\1", rf"\g<1>{REDACTED}\g<1>", text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@" if m.group("password") else m.group(0), text)
    return _SECRET_PAIR.sub(lambda m: m.group("key") + REDACTED, text)


def yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong with a YAML text and where, without the lines PyYAML quotes (one may hold a password)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = ", ".join(str(x) for x in (e.context, e.problem) if x)
        return f"{what or 'malformed'}{where}"
    return type(e).__name__


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PipelineConfig(_Strict):
    receivers: list[str] = Field(default_factory=list)
    processors: list[str] = Field(default_factory=list)
    exporters: list[str] = Field(default_factory=list)


class ApiConfig(_Strict):
    """The API's listener and how large a request body it reads: larger ones get 413 (from their Content-Length
    before a byte is read, else once the body streams past the limit), with the same rule as the OTLP/HTTP
    receiver's `protocols.http.max_request_body_size`."""

    endpoint: str = API_ENDPOINT
    max_request_body_size: int = 4 * MIB
    """Bytes of a request body on every route but the bulk ones: feedback, run records, trace selections, ..."""
    max_bulk_request_body_size: int = 20 * MIB
    """Bytes of a request body on the routes that carry many records or traces with their texts (`BULK_ROUTES`:
    `POST /v1/evaluate`, `POST /v1/runs/{run_id}/score`); they take `max_request_body_size` when that is larger.
    The default is the OTLP/HTTP receiver's: the same texts, sent another way."""

    _not_bool = field_validator("max_request_body_size", "max_bulk_request_body_size", mode="before")(not_bool)
    _check_size = field_validator("max_request_body_size", "max_bulk_request_body_size")(at_least_one)


class MetricsConfig(_Strict):
    address: str = METRICS_ADDRESS
    level: Literal["none", "basic", "normal", "detailed"] = "normal"


class LogsConfig(_Strict):
    level: Literal["debug", "info", "warn", "error"] = "info"
    encoding: Literal["console", "json"] = "console"


class TelemetryConfig(_Strict):
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logs: LogsConfig = Field(default_factory=LogsConfig)


class ServiceConfig(_Strict):
    pipelines: dict[str, PipelineConfig] = Field(default_factory=dict)
    workers: int | Literal["auto"] = Field(default="auto")
    """Processes the traces and logs pipelines run in, sharded by trace id (0 or 1: all in the collector process).
    `auto` (the default): one per core when there is more than one core and the config can run in workers, else
    one process; the ready line and `evalsi validate` say what was chosen and why."""
    worker_max_in_flight: int = Field(default=32, ge=1)
    collector_shard: bool = False
    """With workers: the collector process runs the first shard itself, in a thread, instead of a worker process
    (one process fewer: ~100 MB at idle, and no pipe for that shard's requests and rows), for fewer spans a second.
    It takes a third of the traces a worker process takes, as the collector process also runs the receivers and the
    store."""

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not a number of workers (0 to 64) or auto")
        if not 0 <= value <= 64:
            raise ValueError(f"{value} is not from 0 to 64 (or auto)")
        return value

    """Requests a worker may hold not yet taken by its pipelines before the receivers answer 429."""
    worker_wait: Duration = 1.0
    """How long a request waits for room in the workers owning its traces before the receivers answer 429 /
    `RESOURCE_EXHAUSTED` (never past a gRPC sender's deadline); 0 answers at once."""
    api: ApiConfig = Field(default_factory=ApiConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    durability: DurabilityConfig = Field(default_factory=DurabilityConfig)
    """`memory` (the default) or `wal`: what an answered request survives (see docs/operations.md)."""


_SECTIONS: dict[str, Kind] = {"receivers": "receiver", "processors": "processor", "exporters": "exporter"}


@dataclass(frozen=True)
class Config:
    """A validated config: the service section and each component's typed config by id."""

    service: ServiceConfig
    components: dict[tuple[Kind, str], ComponentConfig] = field(default_factory=dict)
    source: str = ""
    auth: AuthConfig | None = None
    """The `auth` section; None when the config has none (every listener must then be on loopback)."""
    workers_note: str = ""
    """What `service.workers: auto` chose, and why (empty when a number was given)."""

    def component(self, kind: Kind, component_id: str) -> ComponentConfig:
        return self.components[(kind, component_id)]

    def of_type(self, kind: Kind, type_name: str) -> list[tuple[str, ComponentConfig]]:
        return [(cid, c) for (k, cid), c in self.components.items() if k == kind and type_of(cid) == type_name]


DEFAULT_CONFIG: dict[str, Any] = {
    "receivers": {"otlp": {}},
    "processors": {"normalize": {}},
    "exporters": {"clickhouse": {}},
    "service": {
        "pipelines": {
            "traces": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]},
            "logs": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]},
        },
    },
}

_ENV_REF = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_ENV_WHOLE = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")


def type_of(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _path(parts: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in parts)


def resolve_env(node: Any, path: tuple[Any, ...], errors: list[str]) -> Any:
    """Replace `env:VAR` values and `${env:VAR}` / `${VAR:-default}` references from the environment."""
    if isinstance(node, dict):
        return {k: resolve_env(v, (*path, k), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_env(v, (*path, i), errors) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node
    whole = _ENV_WHOLE.fullmatch(node)
    if whole:
        name = whole.group(1)
        if name not in os.environ:
            errors.append(unset_variable(_path(path), name))
            return None
        return os.environ[name]

    def substitute(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        errors.append(unset_variable(_path(path), name))
        return ""

    return _ENV_REF.sub(substitute, node)


def _pydantic_errors(e: ValidationError, prefix: tuple[Any, ...]) -> list[str]:
    out = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        out.append(f"{_path((*prefix, *err['loc']))}: {msg}")
    return out


def parse_config(raw: Any, source: str = "", base_dir: Path | None = None) -> Config:
    """Validate a config document (already parsed from YAML); raise ConfigError listing every problem.

    `base_dir` (the config file's directory) is what components resolve relative file paths against."""
    load_builtin_components()
    context = {"base_dir": base_dir} if base_dir is not None else None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): must be a mapping with receivers, processors, exporters, service"], source)
    errors: list[str] = []
    raw = resolve_env(raw, (), errors)
    # a key whose variable is missing is reported once, by name, not again as a wrong type
    unset = {e.split(": ", 1)[0] for e in errors}
    errors.extend(f"{key}: unknown key" for key in raw if key not in (*_SECTIONS, "service", "auth"))

    sections: dict[str, dict[str, Any]] = {}
    for section in _SECTIONS:
        value = raw.get(section) or {}
        if not isinstance(value, dict):
            errors.append(f"{section}: must be a mapping of component id to its config")
            value = {}
        sections[section] = value
    service: ServiceConfig | None = None
    try:
        service = ServiceConfig.model_validate(raw.get("service") or {})
    except ValidationError as e:
        errors.extend(_pydantic_errors(e, ("service",)))

    components: dict[tuple[Kind, str], ComponentConfig] = {}
    for section, kind in _SECTIONS.items():
        for cid, body in sections[section].items():
            factory = REGISTRY.get((kind, type_of(cid)))
            if factory is None:
                known = sorted(t for (k, t) in REGISTRY if k == kind)
                errors.append(f"{section}.{cid}: unknown {kind} type {type_of(cid)!r} (known: {', '.join(known)})")
                continue
            if body is not None and not isinstance(body, dict):
                errors.append(f"{section}.{cid}: must be a mapping of settings")
                continue
            try:
                components[(kind, cid)] = factory.config.model_validate(body or {}, context=context)
            except ValidationError as e:
                errors.extend(m for m in _pydantic_errors(e, (section, cid)) if m.split(": ", 1)[0] not in unset)

    auth: AuthConfig | None = None
    if raw.get("auth") is not None:
        try:
            auth = AuthConfig.model_validate(raw["auth"], context=context)
        except ValidationError as e:
            errors.extend(m for m in _pydantic_errors(e, ("auth",)) if m.split(": ", 1)[0] not in unset)

    workers_note = ""
    if service is not None:
        if raw.get("auth") is None:
            errors.extend(_open_listener_errors(service, components))
        errors.extend(_pipeline_errors(service, sections))
        errors.extend(_score_sink_errors(service))
        errors.extend(_noop_component_errors(components))
        errors.extend(_idle_evaluate_errors(service, components))
        errors.extend(_store_window_errors(service, components))
        errors.extend(_durability_errors(service))
        errors.extend(_collector_shard_errors(service))
        service, workers_note = _chosen_workers(service)
        errors.extend(_worker_errors(service))
    if errors or service is None:
        raise ConfigError(errors, source, secrets=secret_values(raw))
    return Config(service=service, components=components, source=source, workers_note=workers_note, auth=auth)


def listeners(service: ServiceConfig, components: dict[tuple[Kind, str], ComponentConfig]) -> list[tuple[str, str]]:
    """Every endpoint the config listens on, as (key path, endpoint): the API, self-metrics, and the components'
    (a receiver's protocols, the prometheus exporter's scrape endpoint)."""
    found = [("service.api.endpoint", service.api.endpoint)]
    if service.telemetry.metrics.level != "none":
        found.append(("service.telemetry.metrics.address", service.telemetry.metrics.address))
    for (kind, cid), config in components.items():
        listening = getattr(config, "listeners", None)
        if listening is not None:
            found += [(f"{kind}s.{cid}.{path}", endpoint) for path, endpoint in listening().items()]
    return found


def _open_listener_errors(service: ServiceConfig, components: dict[tuple[Kind, str], ComponentConfig]) -> list[str]:
    """Secure by default: a listener other machines can reach needs an `auth` section."""
    return [
        f"{path}: {endpoint} can be reached from other machines and no `auth` section says who may send or read: "
        "add `auth: {api_keys: [{hash: sha256:…}]}` (`evalsi keys new` prints a key and its hash), listen on "
        "127.0.0.1, or accept anyone with `auth: {mode: none}`"
        for path, endpoint in listeners(service, components)
        if not is_loopback(endpoint)
    ]


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _chosen_workers(service: ServiceConfig) -> tuple[ServiceConfig, str]:
    """`workers` as a number, and what was chosen and why (for `auto`)."""
    workers = service.workers
    if isinstance(workers, int):
        return service.model_copy(update={"workers": max(1, workers)}), ""
    n = cores()
    # with one process there is no shard to take: said, not refused, as the core count is not the config's
    moot = "; collector_shard has nothing to take" if service.collector_shard else ""
    if n <= 1:
        return service.model_copy(update={"workers": 1}), f"workers: auto -> one process (one core){moot}"
    trial = service.model_copy(update={"workers": n})
    why = _worker_errors(trial)
    if why:
        reason = why[0].split(": ", 1)[-1].split(";")[0]
        return service.model_copy(update={"workers": 1}), f"workers: auto -> one process ({reason}){moot}"
    if service.collector_shard:
        return trial, f"workers: auto -> {n} pipeline shards ({n} cores), the first in the collector process"
    return trial, f"workers: auto -> {n} pipeline workers ({n} cores)"


def _collector_shard_errors(service: ServiceConfig) -> list[str]:
    """`collector_shard` with one process asked for would do nothing (`auto` choosing one process says so instead)."""
    if service.collector_shard and isinstance(service.workers, int) and service.workers <= 1:
        return [
            f"service.collector_shard: runs the first of the pipeline shards in the collector process, but "
            f"service.workers is {service.workers}, one process that runs them all already: remove collector_shard, "
            "or set service.workers to 2 or more (or auto)"
        ]
    return []


def _durability_errors(service: ServiceConfig) -> list[str]:
    """A write-ahead log keeps each request until the store holds it: with no store it would keep everything."""
    if service.durability.mode != "wal":
        return []
    signals = {type_of(n) for n, p in service.pipelines.items() if any(is_store(e) for e in p.exporters)}
    if not signals & {"traces", "logs"}:
        return [
            "service.durability.mode: wal keeps each request until the store holds it, but no pipeline writes a "
            "store (e.g. clickhouse): add the store to a traces pipeline, or set mode: memory"
        ]
    return []


def _worker_errors(service: ServiceConfig) -> list[str]:
    """Why this config cannot run its pipelines in worker processes (each naming its key path), or nothing."""
    if service.workers <= 1:
        return []
    problems = []
    stores: set[str] = set()
    for name, pipe in service.pipelines.items():
        for i, rid in enumerate(pipe.receivers):
            factory = REGISTRY.get(("receiver", type_of(rid)))
            if factory is not None and factory.decode is None and type_of(name) != "scores":
                problems.append(
                    f"service.pipelines.{name}.receivers.{i}: receiver {rid!r} cannot hand its requests to pipeline "
                    "workers; set service.workers: 1"
                )
        stores.update(eid for eid in pipe.exporters if is_store(eid))
    if len(stores) > 1:
        problems.append(
            f"service.workers: with more than one worker the pipelines write one store, not {len(stores)} "
            f"({', '.join(sorted(stores))})"
        )
    return problems


def _pipeline_errors(service: ServiceConfig, sections: dict[str, dict[str, Any]]) -> list[str]:
    errors = []
    processor_owner: dict[tuple[str, str], str] = {}  # one instance serves one pipeline per signal
    if not service.pipelines:
        errors.append("service.pipelines: at least one pipeline is required")
    for name, pipe in service.pipelines.items():
        where = f"service.pipelines.{name}"
        if type_of(name) not in SIGNALS:
            errors.append(f"{where}: unsupported pipeline type {type_of(name)!r} (supported: {', '.join(SIGNALS)})")
        if not pipe.receivers and type_of(name) != "scores":  # scores come from processors that evaluate
            errors.append(f"{where}.receivers: at least one receiver is required")
        if not pipe.exporters:
            errors.append(f"{where}.exporters: at least one exporter is required")
        data = type_of(name)
        for section, kind in _SECTIONS.items():
            seen: set[str] = set()
            for i, cid in enumerate(getattr(pipe, section)):
                if cid in seen:
                    errors.append(f"{where}.{section}.{i}: {cid!r} is listed twice")
                seen.add(cid)
                if cid not in sections[section]:
                    errors.append(f"{where}.{section}.{i}: {kind} {cid!r} is not defined in {section}")
                    continue
                factory = REGISTRY.get((kind, type_of(cid)))
                if factory is not None and data in SIGNALS and data not in factory.signals:
                    errors.append(
                        f"{where}.{section}.{i}: {kind} {cid!r} does not take {data} "
                        f"(it takes {', '.join(factory.signals)})"
                    )
                if kind == "processor" and i > 0 and factory is not None and factory.first:
                    errors.append(
                        f"{where}.{section}.{i}: processor {cid!r} must be listed first: {factory.first}; after "
                        f"{pipe.processors[0]!r} it would refuse data that processor already took"
                    )
                if kind == "processor":
                    owner = processor_owner.setdefault((cid, data), name)
                    if owner != name:
                        errors.append(
                            f"{where}.{section}.{i}: processor {cid!r} is already in {data} pipeline {owner!r}; "
                            f"declare another one (e.g. {type_of(cid)}/2) for this pipeline"
                        )
        if data == "traces":
            errors.extend(_batch_flow_errors(where, pipe))
    return errors


def _batch_flow_errors(where: str, pipe: PipelineConfig) -> list[str]:
    """A processor that acts only on some kind of span batch (`evaluate`: whole traces) would do nothing unless a
    processor before it in the pipeline hands that kind on (`tail_sampling`)."""
    errors = []
    made: set[str] = set()
    for i, pid in enumerate(pipe.processors):
        factory = REGISTRY.get(("processor", type_of(pid)))
        if factory is None:
            continue
        if factory.needs is not None and factory.needs not in made:
            makers = sorted(t for (k, t), f in REGISTRY.items() if k == "processor" and factory.needs in f.makes)
            errors.append(
                f"{where}.processors.{i}: processor {pid!r} acts on {factory.needs} batches, and no processor before "
                f"it hands them on, so it would never run; put {' or '.join(makers) or 'a processor that does'} "
                "before it"
            )
        made.update(factory.makes)
    return errors


def _score_sink_errors(service: ServiceConfig) -> list[str]:
    """A processor that produces scores (`evaluate`) hands them to the `scores` pipelines: with none, every score
    would be counted and dropped. (The list items are quoted: `evalsi validate` prints through rich, which would
    take `[clickhouse]` for markup.)"""
    if any(type_of(name) == "scores" for name in service.pipelines):
        return []
    errors = []
    for name, pipe in service.pipelines.items():
        if type_of(name) not in ("traces", "logs"):
            continue
        store = next((eid for eid in pipe.exporters if is_store(eid)), "clickhouse")
        for i, pid in enumerate(pipe.processors):
            factory = REGISTRY.get(("processor", type_of(pid)))
            if factory is None or "scores" not in factory.signals:
                continue
            errors.append(
                f"service.pipelines.{name}.processors.{i}: processor {pid!r} produces scores, and there is no scores "
                f'pipeline to take them, so every score would be dropped: add `scores: {{exporters: ["{store}"]}}` '
                f'to service.pipelines (or `scores: {{processors: ["{pid}"], exporters: ["{store}"]}}`, which '
                "also lets policies that read `feedback` see POST /v1/feedback)"
            )
    return errors


def _idle_evaluate_errors(service: ServiceConfig, components: dict[tuple[Kind, str], ComponentConfig]) -> list[str]:
    """`evaluate` in a traces pipeline runs its policies over each trace: with none it evaluates nothing. (In a logs
    or scores pipeline it has work without policies: external evaluations, feedback.)"""
    errors = []
    for name, pipe in service.pipelines.items():
        if type_of(name) != "traces":
            continue
        for i, pid in enumerate(pipe.processors):
            config = components.get(("processor", pid))
            if type_of(pid) == "evaluate" and config is not None and not getattr(config, "policies", None):
                errors.append(
                    f"service.pipelines.{name}.processors.{i}: processor {pid!r} has no policies, so it would "
                    f'evaluate no trace: add `policies: ["policies/*.yaml"]` to processors.{pid} (policy files, '
                    "relative to the config file), or remove it from this pipeline"
                )
    return errors


def _store_window_errors(service: ServiceConfig, components: dict[tuple[Kind, str], ComponentConfig]) -> list[str]:
    """`windows.scope: store` reads every replica's scores from the store the scores pipelines write, and
    `promote_to: store` writes there: without a store exporter in a scores pipeline neither has a store."""
    stored = any(type_of(name) == "scores" and any(is_store(e) for e in pipe.exporters)
                 for name, pipe in service.pipelines.items())  # fmt: skip
    if stored:
        return []
    errors = []
    for (kind, pid), config in components.items():
        if kind != "processor" or type_of(pid) != "evaluate":
            continue
        windows = getattr(config, "windows", None)
        if windows is not None and windows.scope == "store":
            errors.append(
                f"processors.{pid}.windows.scope: `store` reads the policies' windows from the store the scores "
                'pipeline writes, and no scores pipeline exports to a store: add `scores: {exporters: ["clickhouse"]}` '
                "to service.pipelines (with a clickhouse exporter), or set scope: process"
            )
        if getattr(config, "promote_to", "") == "store":
            errors.append(
                f"processors.{pid}.promote_to: `store` writes promoted rows to the store of the scores pipeline, and "
                'no scores pipeline exports to a store: add `scores: {exporters: ["clickhouse"]}` to '
                "service.pipelines (with a clickhouse exporter), or set promote_to: files"
            )
    return errors


def _noop_component_errors(components: dict[tuple[Kind, str], ComponentConfig]) -> list[str]:
    """Components whose settings leave them nothing to do: a `redact` with no rule at all, a `tail_sampling` whose
    every policy can never sample a trace."""
    errors = []
    for (kind, cid), config in components.items():
        if kind != "processor":
            continue
        kind_of = type_of(cid)
        if kind_of == "redact" and _redacts_nothing(config):
            errors.append(
                f"processors.{cid}: redact has no rule (default_rules: [], no rules, blocked_values, "
                "blocked_key_patterns, allow_all_keys: false nor presidio.enabled), so it would change nothing: "
                "remove default_rules: [] to run the built-in rules, add rules, or remove the processor"
            )
        elif kind_of == "tail_sampling":
            policies = getattr(config, "policies", None) or []
            if policies and all(_never_samples(p) for p in policies):
                errors.append(
                    f"processors.{cid}.policies: no policy can ever sample a trace (drop policies only decide what "
                    "is dropped; a 0% probabilistic policy samples nothing), so no trace would be kept: add a policy "
                    "that samples (e.g. `{name: all, type: always_sample}`), or remove policies to keep every trace"
                )
    return errors


def _redacts_nothing(config: Any) -> bool:
    presidio = getattr(config, "presidio", None)
    return not (
        config.default_rules
        or config.rules
        or config.blocked_values
        or config.blocked_key_patterns
        or not config.allow_all_keys
        or (presidio is not None and presidio.enabled)
    )


def _never_samples(policy: Any) -> bool:
    """Whether a tail sampling policy can never vote to sample (a `drop` never does; see its docs)."""
    kind = policy.type
    if kind == "drop":
        return True
    if kind == "probabilistic":
        return policy.probabilistic.sampling_percentage <= 0
    if kind == "and":
        return any(_never_samples(p) for p in policy.and_.and_sub_policy)
    if kind == "composite":
        return all(_never_samples(p) for p in policy.composite.composite_sub_policy)
    return False


def load_config(path: str | Path | None) -> Config:
    """Load a YAML config file, or the laptop defaults when `path` is None."""
    if path is None:
        return parse_config(DEFAULT_CONFIG, "(defaults)")
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError([f"cannot read {p}: {e.strerror}"], str(p)) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {yaml_problem(e)}"], str(p)) from None
    return parse_config(raw, str(p), base_dir=p.resolve().parent)


def is_store(exporter_id: str) -> bool:
    """Whether the exporter's type owns a store (registered with `store=`): with service.workers > 1 it stays in
    the collector process, and the workers' store links stand in for it."""
    factory = REGISTRY.get(("exporter", type_of(exporter_id)))
    return factory is not None and factory.store is not None
