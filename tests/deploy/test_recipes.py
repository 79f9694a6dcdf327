"""The deployment recipes, run: the SDK environment variables of docs/otel-sdk.md and the collector-to-evalsi hop of
docs/tee.md with real OTLP exporters into an `evalsi serve` that requires an API key, and every config block of
docs/tee.md, docs/otel-sdk.md and docs/agentgateway.md (and deploy/agentgateway/config.yaml) checked against what reads
it, the key each sender sends included."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._configuration import _get_exporter_names, _import_exporters
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.auth import Authenticator, is_loopback, new_key
from evalsi.collector.config import listeners, parse_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DOCS = ("docs/tee.md", "docs/otel-sdk.md", "docs/agentgateway.md")
AGENTGATEWAY_CONFIG = "deploy/agentgateway/config.yaml"
SHIPPED_OTELCOL = {"grpc": "deploy/otelcol/tee.yaml", "http": "deploy/otelcol/tee-http.yaml"}
COMPOSE = "deploy/compose/compose.yaml"
# the key a reader makes with `evalsi keys new`: its hash goes in evalsi's config, the key in each sender's environment
KEY, KEY_HASH = new_key()
KEY_HEADERS = {"Authorization": f"Bearer {KEY}"}


# --- the docs' code blocks ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
# every YAML block of the recipe pages opens with a comment naming what reads it
KINDS = ("evalsi", "otelcol", "agentgateway", "kubernetes")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str | None:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        m = re.match(r"#\s*(\w+)", first)
        return m.group(1) if m and m.group(1) in KINDS else None

    def load(self) -> Any:
        return yaml.safe_load(self.text)


def blocks(doc: str, lang: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    return [
        Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == lang
    ]


YAML_BLOCKS = [b for doc in RECIPE_DOCS for b in blocks(doc, "yaml")]


def of_kind(kind: str) -> list[Block]:
    return [b for b in YAML_BLOCKS if b.kind == kind]


def test_every_yaml_block_names_what_reads_it() -> None:
    unnamed = [b.where for b in YAML_BLOCKS if b.kind is None]
    assert not unnamed, f"YAML blocks must open with a `# {' | '.join(KINDS)} ...` comment: {unnamed}"
    assert {b.kind for b in YAML_BLOCKS} == set(KINDS)


@pytest.mark.parametrize("block", of_kind("evalsi"), ids=lambda b: b.where)
def test_evalsi_blocks_are_valid_configs(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(re.findall(r"\$\{env:(\w+)\}", block.text)) <= {"EVALSI_API_KEY_HASH"}, "the hash from the environment"
    monkeypatch.setenv("EVALSI_API_KEY_HASH", KEY_HASH)
    config = parse_config(block.load(), source=block.where)
    if any(not is_loopback(endpoint) for _, endpoint in listeners(config.service, config.components)):
        # a recipe that lets other machines in requires the key its senders send
        assert config.auth is not None and config.auth.mode == "strict", block.where
        assert Authenticator(config.auth).check(f"Bearer {KEY}").authenticated


# --- OpenTelemetry Collector configs --------------------------------------------------------------------------------

# The keys each component takes, from the OpenTelemetry Collector's generated config schemas (open-telemetry/
# opentelemetry-collector main at 934999fb, August 2026): exporter/otlpexporter/config.schema.yaml is
# configgrpc.client_config + exporterhelper's timeout + retry_on_failure + sending_queue;
# exporter/otlphttpexporter/config.schema.yaml is confighttp.client_config + the per-signal endpoints, encoding,
# retry_on_failure and sending_queue; the nested keys are config/configtls, config/configretry and
# exporter/exporterhelper/internal/queuebatch's. The components' READMEs (exporter/otlpexporter,
# exporter/otlphttpexporter, exporter/exporterhelper) document the same keys. Since v0.144.0 the types are `otlp_grpc`
# and `otlp_http`, with `otlp` and `otlphttp` kept as deprecated aliases (CHANGELOG v0.144.0, #14403 / #14396).
EXPORTER_FAMILY = {"otlp": "grpc", "otlp_grpc": "grpc", "otlphttp": "http", "otlp_http": "http"}
HELPER_KEYS = {"timeout", "retry_on_failure", "sending_queue"}
EXPORTER_KEYS = {
    "grpc": HELPER_KEYS
    | {"auth", "authority", "balancer_name", "compression", "endpoint", "headers", "keepalive", "middlewares"}
    | {"read_buffer_size", "tls", "user_agent", "wait_for_ready", "write_buffer_size"},
    "http": HELPER_KEYS
    | {"traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint", "encoding"}
    | {"auth", "compression", "compression_params", "cookies", "disable_keep_alives", "endpoint"}
    | {"force_attempt_http2", "headers", "http2_ping_timeout", "http2_read_idle_timeout", "idle_conn_timeout"}
    | {"max_conns_per_host", "max_idle_conns", "max_idle_conns_per_host", "middlewares", "proxy_url"}
    | {"read_buffer_size", "tls", "write_buffer_size"},
}
NESTED_KEYS = {
    "tls": {"insecure", "insecure_skip_verify", "server_name_override", "ca_file", "ca_pem", "cert_file", "cert_pem"}
    | {"key_file", "key_pem", "cipher_suites", "curve_preferences", "include_system_ca_certs_pool", "max_version"}
    | {"min_version", "reload_interval", "tpm"},
    "retry_on_failure": {"enabled", "initial_interval", "max_interval", "max_elapsed_time", "multiplier"}
    | {"randomization_factor"},
    "sending_queue": {"enabled", "num_consumers", "wait_for_result", "block_on_overflow", "sizer", "queue_size"}
    | {"storage", "batch"},
}
QUEUE_BATCH_KEYS = {"flush_timeout", "min_size", "max_size", "sizer", "partition"}
COMPRESSIONS = {"gzip", "zlib", "deflate", "snappy", "x-snappy-framed", "zstd", "lz4", "none", ""}  # configcompression
# processor/batchprocessor and internal/memorylimiter config.schema.yaml; receiver/otlpreceiver's top level
PROCESSOR_KEYS = {
    "batch": {"send_batch_size", "send_batch_max_size", "timeout", "metadata_keys", "metadata_cardinality_limit"},
    "memory_limiter": {"check_interval", "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage"}
    | {"min_gc_interval_when_soft_limited", "min_gc_interval_when_hard_limited", "max_gc_interval_when_soft_limited"}
    | {"max_gc_interval_when_hard_limited"},
}
PIPELINE_TYPES = {"traces", "metrics", "logs", "profiles"}
# What evalsi's receiver inflates (evalsi/receivers/otlp): over gRPC what grpcio's server decodes (gzip; the
# collector's gRPC client offers gzip, snappy, zstd), over HTTP gzip, deflate (zlib-wrapped, as the collector's
# writes it) and zstd. The collector's default for both exporters is gzip.
EVALSI_COMPRESSION = {"grpc": {"gzip", "none"}, "http": {"gzip", "deflate", "zstd", "none"}}
EVALSI_PORT = {"grpc": 4317, "http": 4318}


def _host_port(endpoint: str) -> tuple[str, int | None]:
    rest = endpoint.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return (host, int(port)) if port.isdigit() else (rest, None)


def evalsi_exporters(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The OTLP exporters of a collector config that send to evalsi: named `<type>/evalsi` or aimed at host `evalsi`."""
    found = {}
    for eid, ecfg in (cfg.get("exporters") or {}).items():
        if eid.split("/")[0] not in EXPORTER_FAMILY:
            continue
        endpoint = str((ecfg or {}).get("endpoint", ""))
        if eid.split("/", 1)[-1] == "evalsi" or _host_port(endpoint)[0] == "evalsi":
            found[eid] = ecfg or {}
    return found


def otelcol_problems(cfg: Any) -> list[str]:
    """What the Collector would refuse in a config, or what the upstream docs do not list: every key checked against
    the allow-lists above, every pipeline entry against the components defined."""
    if not isinstance(cfg, dict):
        return ["not a mapping"]
    problems = []
    sections = ("receivers", "processors", "exporters", "connectors", "extensions")
    problems += [f"{k}: unknown top-level key" for k in cfg if k not in (*sections, "service")]
    defined = {s: (cfg.get(s) or {}) for s in sections}
    service = cfg.get("service") or {}
    problems += [
        f"service.extensions: {e} not defined" for e in service.get("extensions", []) if e not in defined["extensions"]
    ]
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("service.pipelines: none")
    for pid, p in pipelines.items():
        if pid.split("/")[0] not in PIPELINE_TYPES:
            problems.append(f"service.pipelines.{pid}: unknown pipeline type")
        for role in ("receivers", "processors", "exporters"):
            for cid in p.get(role) or []:
                if cid not in defined[role] and cid not in defined["connectors"]:
                    problems.append(f"service.pipelines.{pid}.{role}: {cid} is not defined")
        if not p.get("receivers") or not p.get("exporters"):
            problems.append(f"service.pipelines.{pid}: needs receivers and exporters")
    for eid, ecfg in defined["exporters"].items():
        family = EXPORTER_FAMILY.get(eid.split("/")[0])
        if family is None:
            continue
        ecfg = ecfg or {}
        problems += [
            f"exporters.{eid}.{k}: not a key of the {eid.split('/')[0]} exporter"
            for k in ecfg
            if k not in EXPORTER_KEYS[family]
        ]
        for key, allowed in NESTED_KEYS.items():
            problems += [f"exporters.{eid}.{key}.{k}: unknown key" for k in (ecfg.get(key) or {}) if k not in allowed]
        batch = (ecfg.get("sending_queue") or {}).get("batch") or {}
        problems += [
            f"exporters.{eid}.sending_queue.batch.{k}: unknown key" for k in batch if k not in QUEUE_BATCH_KEYS
        ]
        if str(ecfg.get("compression", "gzip")) not in COMPRESSIONS:
            problems.append(f"exporters.{eid}.compression: {ecfg['compression']!r} is not a collector compression")
    for pid, pcfg in defined["processors"].items():
        allowed = PROCESSOR_KEYS.get(pid.split("/")[0])
        if allowed is not None:
            problems += [f"processors.{pid}.{k}: unknown key" for k in (pcfg or {}) if k not in allowed]
    for rid, rcfg in defined["receivers"].items():
        if rid.split("/")[0] == "otlp":
            problems += [f"receivers.{rid}.{k}: unknown key" for k in (rcfg or {}) if k != "protocols"]
            protocols = (rcfg or {}).get("protocols") or {}
            problems += [
                f"receivers.{rid}.protocols.{k}: unknown protocol" for k in protocols if k not in ("grpc", "http")
            ]
    return problems


def tee_problems(cfg: dict[str, Any]) -> list[str]:
    """What evalsi needs of a collector that tees into it, beyond the collector's own rules."""
    problems = []
    teed = evalsi_exporters(cfg)
    if not teed:
        return ["no exporter sends to evalsi"]
    for eid, ecfg in teed.items():
        family = EXPORTER_FAMILY[eid.split("/")[0]]
        endpoint = str(ecfg.get("endpoint", ""))
        host, port = _host_port(endpoint)
        compression = str(ecfg.get("compression", "gzip"))
        if compression not in EVALSI_COMPRESSION[family]:
            problems.append(f"exporters.{eid}.compression: evalsi's {family} receiver cannot inflate {compression!r}")
        if host == "evalsi":  # straight at evalsi, whose receivers speak plaintext
            if port != EVALSI_PORT[family]:
                problems.append(f"exporters.{eid}.endpoint: evalsi takes OTLP/{family} on {EVALSI_PORT[family]}")
            if endpoint.startswith("https://"):
                problems.append(f"exporters.{eid}.endpoint: evalsi's receiver has no TLS; use http://")
            if (
                family == "grpc"
                and not endpoint.startswith("http://")
                and (ecfg.get("tls") or {}).get("insecure") is not True
            ):
                problems.append(f"exporters.{eid}.tls.insecure: must be true (evalsi's gRPC receiver is plaintext)")
        authorization = str((ecfg.get("headers") or {}).get("authorization", ""))
        if not re.fullmatch(r"Bearer \$\{env:\w+\}", authorization):
            problems.append(
                f"exporters.{eid}.headers.authorization: evalsi needs `Bearer ${{env:VAR}}`, the key from the "
                f"collector's environment (not written in the file), got {authorization!r}"
            )
        for pid, p in ((cfg.get("service") or {}).get("pipelines") or {}).items():
            exporters = p.get("exporters") or []
            if eid not in exporters:
                continue
            if pid.split("/")[0] not in ("traces", "logs"):
                problems.append(f"service.pipelines.{pid}: evalsi takes traces and logs only")
            if len(exporters) < 2:
                problems.append(f"service.pipelines.{pid}: a tee keeps the existing exporter beside {eid}")
    return problems


@pytest.mark.parametrize("block", of_kind("otelcol"), ids=lambda b: b.where)
def test_otelcol_blocks_are_coherent_tees(block: Block) -> None:
    cfg = block.load()
    assert otelcol_problems(cfg) == []
    assert tee_problems(cfg) == []


def _family_of(cfg: dict[str, Any]) -> set[str]:
    return {EXPORTER_FAMILY[eid.split("/")[0]] for eid in evalsi_exporters(cfg)}


def _direct(cfg: dict[str, Any]) -> bool:
    """Every evalsi exporter aims at evalsi itself (not at a proxy in front of it)."""
    return all(_host_port(str(e.get("endpoint", "")))[0] == "evalsi" for e in evalsi_exporters(cfg).values())


@pytest.mark.parametrize("family", sorted(SHIPPED_OTELCOL))
def test_tee_snippets_match_the_shipped_collector_configs(family: str) -> None:
    """docs/tee.md names the shipped files and shows their evalsi exporter: the two must agree."""
    path = SHIPPED_OTELCOL[family]
    assert path in (ROOT / "docs/tee.md").read_text(), f"docs/tee.md should point at {path}"
    snippets = [
        b
        for b in of_kind("otelcol")
        if b.doc == "docs/tee.md" and _family_of(b.load()) == {family} and _direct(b.load())
    ]
    assert snippets, f"docs/tee.md shows no {family} tee"
    assert (ROOT / path).exists(), f"docs/tee.md points at {path}, which is not in the repository"
    shipped = yaml.safe_load((ROOT / path).read_text())
    assert otelcol_problems(shipped) == []
    assert tee_problems(shipped) == []
    [file_exporter] = evalsi_exporters(shipped).values()
    for block in snippets:
        shown = block.load()
        [doc_exporter] = evalsi_exporters(shown).values()
        assert _host_port(str(doc_exporter["endpoint"]))[1] == _host_port(str(file_exporter["endpoint"]))[1]
        if family == "grpc":
            assert (doc_exporter.get("tls") or {}).get("insecure") == (file_exporter.get("tls") or {}).get("insecure")
        assert _teed_pipelines(shown) == _teed_pipelines(shipped), block.where
        assert doc_exporter["headers"] == file_exporter["headers"], f"{block.where}: the same key variable as {path}"


def _teed_pipelines(cfg: dict[str, Any]) -> set[str]:
    """The pipeline types that send to evalsi."""
    teed = set(evalsi_exporters(cfg))
    return {p.split("/")[0] for p, c in cfg["service"]["pipelines"].items() if teed & set(c.get("exporters") or [])}


def test_compose_mounts_the_agentgateway_config() -> None:
    assert (ROOT / COMPOSE).exists(), f"{COMPOSE} is missing: the compose recipe ships with the repository"
    compose = yaml.safe_load((ROOT / COMPOSE).read_text())
    services = compose.get("services") or {}
    assert "evalsi" in services, "agentgateway's config sends to the compose service `evalsi`"
    mounted = []
    for name, svc in services.items():
        for volume in svc.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else str(volume).split(":", 1)[0]
            if source and (ROOT / COMPOSE).parent.joinpath(source).resolve() == (ROOT / AGENTGATEWAY_CONFIG).resolve():
                mounted.append(name)
    assert mounted, f"no compose service mounts {AGENTGATEWAY_CONFIG}"


# --- agentgateway ---------------------------------------------------------------------------------------------------

# agentgateway's JSON schema for its config file (agentgateway/agentgateway schema/config.json, the same at v1.4.1 and
# main 75b4e6ce, August 2026), the parts these configs use. `config.tracing` is the older form, which agentgateway
# rewrites into `frontendPolicies.tracing` (crates/agentgateway/src/types/local.rs) and refuses beside it.
AGW_TOP = {"config", "binds", "frontendPolicies", "policies", "workloads", "services", "backends", "routeGroups"}
AGW_TOP |= {"gateways", "routes", "tcpRoutes", "llm", "mcp", "ui"}
AGW_RAW_TRACING = {"otlpEndpoint", "headers", "otlpProtocol", "fields", "randomSampling", "clientSampling", "path"}
AGW_TRACING = {"policies", "attributes", "resources", "remove", "randomSampling", "clientSampling", "filter", "path"}
AGW_TRACING |= {"protocol"}
AGW_TRACING_TARGETS = {"service", "host", "backend"}  # exactly one
AGW_LLM = {"gateways", "port", "tls", "providers", "models", "virtualModels", "policies"}
AGW_MODEL = {"auth", "authorization", "backendTLS", "backendTunnel", "defaults", "finalTransformation", "guardrails"}
AGW_MODEL |= {"health", "id", "matches", "name", "overrides", "params", "passthrough", "promptCaching", "provider"}
AGW_MODEL |= {"requestHeaders", "responseHeaders", "tls", "transformation", "visibility"}
AGW_PARAMS = {"model", "apiKey", "awsRegion", "vertexRegion", "vertexProject", "azureResourceName"}
AGW_PARAMS |= {"azureResourceType", "azureApiVersion", "azureProjectName", "baseUrl", "hostOverride", "pathOverride"}
AGW_PARAMS |= {"pathPrefix", "tokenize"}
AGW_PROVIDERS = {"openai", "openAI", "gemini", "vertex", "anthropic", "bedrock", "azure", "copilot", "cohere", "ollama"}
AGW_PROVIDERS |= {"baseten", "cerebras", "deepinfra", "deepseek", "groq", "huggingface", "mistral", "openrouter"}
AGW_PROVIDERS |= {"togetherai", "xai", "fireworks"}
AGW_GATEWAY = {"port", "protocol", "listeners", "tls", "oidc", "jwtAuth", "authorization", "extAuthz", "extProc"}
AGW_GATEWAY |= {"cors", "transformations", "basicAuth", "apiKey"}
AGW_TRACING_POLICIES = {"requestHeaderModifier", "transformations", "backendTLS", "backendAuth", "http", "tcp"}
AGW_TRACING_POLICIES |= {"backendTunnel"}  # SimpleLocalBackendPolicies: the connection to the trace collector
SAMPLING = (bool, int, float, str)  # StringBoolFloat: a ratio, true/false, or a CEL expression
AGW_ENV = {"EVALSI_API_KEY": KEY}  # what deploy/compose (or the reader) puts in agentgateway's environment


def agentgateway_expand(text: str, env: dict[str, str]) -> str:
    """What agentgateway does to its config file before parsing it (crates/agentgateway/src/config.rs): drop the
    yaml-language-server schema comment, then shellexpand::full the whole text, comments included: `$VAR`, `${VAR}`
    and `${VAR:-default}`, and an unset variable without a default is an error."""
    text = text.replace("# yaml-language-server: $schema", "#")

    def value(m: re.Match[str]) -> str:
        name, default = m.group(1) or m.group(3), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise AssertionError(f"agentgateway would refuse to start: ${name} is unset and has no default")

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", value, text)


def agentgateway_problems(cfg: Any) -> list[str]:
    if not isinstance(cfg, dict):
        return ["not a mapping"]
    problems = [f"{k}: not a top-level key" for k in cfg if k not in AGW_TOP]
    raw = ((cfg.get("config") or {}).get("tracing")) or None
    policy = (cfg.get("frontendPolicies") or {}).get("tracing")
    if raw is not None and policy is not None:
        problems.append("config.tracing and frontendPolicies.tracing: agentgateway refuses both")
    if raw is not None:
        problems += [f"config.tracing.{k}: unknown key" for k in raw if k not in AGW_RAW_TRACING]
        if raw.get("otlpProtocol", "grpc") not in ("grpc", "http"):
            problems.append("config.tracing.otlpProtocol: grpc or http")
        problems += [
            f"config.tracing.fields.{k}: unknown key" for k in raw.get("fields") or {} if k not in ("add", "remove")
        ]
    if policy is not None:
        problems += [
            f"frontendPolicies.tracing.{k}: unknown key" for k in policy if k not in AGW_TRACING | AGW_TRACING_TARGETS
        ]
        if len(AGW_TRACING_TARGETS & set(policy)) != 1:
            problems.append("frontendPolicies.tracing: exactly one of service, host, backend")
        if policy.get("protocol", "grpc") not in ("grpc", "http"):
            problems.append("frontendPolicies.tracing.protocol: grpc or http")
        problems += [
            f"frontendPolicies.tracing.attributes.{k}: a CEL string"
            for k, v in (policy.get("attributes") or {}).items()
            if not isinstance(v, str)
        ]
        backend = policy.get("policies") or {}
        problems += [
            f"frontendPolicies.tracing.policies.{k}: not a backend policy"
            for k in backend
            if k not in AGW_TRACING_POLICIES
        ]
        key = (backend.get("backendAuth") or {}).get("key")
        if "backendAuth" in backend and not (isinstance(key, str) or (isinstance(key, dict) and set(key) == {"file"})):
            problems.append("frontendPolicies.tracing.policies.backendAuth.key: a string, or {file: PATH}")
    for tracing in (raw, policy):
        for key in ("randomSampling", "clientSampling"):
            if tracing is not None and key in tracing and not isinstance(tracing[key], SAMPLING):
                problems.append(f"tracing.{key}: a ratio, true/false or a CEL expression")
    for name, gw in (cfg.get("gateways") or {}).items():
        problems += [f"gateways.{name}.{k}: unknown key" for k in gw or {} if k not in AGW_GATEWAY]
    llm = cfg.get("llm")
    if llm is not None:
        problems += [f"llm.{k}: unknown key" for k in llm if k not in AGW_LLM]
        for i, model in enumerate(llm.get("models") or []):
            problems += [f"llm.models.{i}.{k}: unknown key" for k in model if k not in AGW_MODEL]
            if "name" not in model or "provider" not in model:
                problems.append(f"llm.models.{i}: name and provider are required")
            provider = model.get("provider")
            if isinstance(provider, str) and provider not in AGW_PROVIDERS:
                problems.append(f"llm.models.{i}.provider: {provider!r} is not a provider agentgateway knows")
            problems += [
                f"llm.models.{i}.params.{k}: unknown key" for k in model.get("params") or {} if k not in AGW_PARAMS
            ]
    return problems


def _tracing_target(cfg: dict[str, Any]) -> tuple[str, str]:
    """(address, protocol) agentgateway exports its traces to."""
    policy = (cfg.get("frontendPolicies") or {}).get("tracing")
    if policy is not None:
        return str(policy.get("host", "")), str(policy.get("protocol", "grpc"))
    raw = cfg["config"]["tracing"]
    return str(raw["otlpEndpoint"]).split("://", 1)[-1], str(raw.get("otlpProtocol", "grpc"))


def _key_sent(cfg: dict[str, Any]) -> str | None:
    """The evalsi API key agentgateway sends with its trace exports, as evalsi reads it from `Bearer <key>`."""
    policy = (cfg.get("frontendPolicies") or {}).get("tracing")
    if policy is not None:
        backend = policy.get("policies") or {}
        if "backendAuth" in backend:
            return str(backend["backendAuth"]["key"])  # sent as `Authorization: Bearer <key>`
        value = str(((backend.get("requestHeaderModifier") or {}).get("set") or {}).get("authorization", ""))
    else:
        # config.tracing.headers become a transformation of CEL expressions: a literal is a quoted CEL string
        value = str((cfg["config"]["tracing"].get("headers") or {}).get("authorization", ""))
        if not re.fullmatch(r'"[^"\\]*"', value):
            return None
        value = value[1:-1]
    return value.removeprefix("Bearer ") if value.startswith("Bearer ") else None


@pytest.mark.parametrize("block", of_kind("agentgateway"), ids=lambda b: b.where)
def test_agentgateway_blocks_follow_its_schema(block: Block) -> None:
    cfg = yaml.safe_load(agentgateway_expand(block.text, AGW_ENV))
    assert agentgateway_problems(cfg) == []
    address, protocol = _tracing_target(cfg)
    assert address == {"grpc": "evalsi:4317", "http": "evalsi:4318"}[protocol]
    assert _key_sent(cfg) == KEY, "every export to evalsi carries the key from EVALSI_API_KEY"
    with pytest.raises(AssertionError, match="EVALSI_API_KEY"):
        agentgateway_expand(block.text, {})  # no default key: a gateway without one does not start


def test_shipped_agentgateway_config_routes_an_llm_and_traces_to_evalsi() -> None:
    text = (ROOT / AGENTGATEWAY_CONFIG).read_text()
    cfg = yaml.safe_load(agentgateway_expand(text, AGW_ENV))  # the defaults and the evalsi key must start it
    assert agentgateway_problems(cfg) == []
    assert _tracing_target(cfg) == ("evalsi:4317", "grpc")
    assert _key_sent(cfg) == KEY
    with pytest.raises(AssertionError, match="EVALSI_API_KEY"):
        agentgateway_expand(text, {})
    tracing = cfg["frontendPolicies"]["tracing"]
    assert tracing["randomSampling"] is True
    assert tracing["attributes"]["gen_ai.prompt"] == "flattenRecursive(llm.prompt)"
    [model] = cfg["llm"]["models"]
    assert model["provider"] in ("openai", "openAI") and model["name"] == "*"
    assert model["params"]["baseUrl"] == "https://api.openai.com/v1"
    local = yaml.safe_load(
        agentgateway_expand(text, {"LLM_BASE_URL": "http://llm:8000/v1", "OPENAI_API_KEY": "k", **AGW_ENV})
    )
    assert local["llm"]["models"][0]["params"] == {"baseUrl": "http://llm:8000/v1", "apiKey": "k"}
    # deploy/compose passes both variables set but empty when the user sets neither; shellexpand takes a `:-` default
    # only for an unset variable, so the keys are left empty (YAML null): agentgateway's own defaults apply
    empty = yaml.safe_load(agentgateway_expand(text, {"LLM_BASE_URL": "", "OPENAI_API_KEY": "", **AGW_ENV}))
    assert agentgateway_problems(empty) == []
    assert empty["llm"]["models"][0]["params"] == {"baseUrl": None, "apiKey": None}
    assert cfg["gateways"]["default"]["port"] == 3000


def test_shipped_agentgateway_config_against_the_published_schema() -> None:
    """agentgateway publishes a JSON schema of its config (schema/config.json in its repository, also served at
    https://agentgateway.dev/schema/config); no installed package carries it and this project vendors nothing, so
    point AGENTGATEWAY_CONFIG_SCHEMA at a copy to run this check."""
    path = os.environ.get("AGENTGATEWAY_CONFIG_SCHEMA")
    if not path:
        pytest.skip("set AGENTGATEWAY_CONFIG_SCHEMA to agentgateway's schema/config.json to validate against it")
    schema = json.loads(Path(path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    docs = [(AGENTGATEWAY_CONFIG, (ROOT / AGENTGATEWAY_CONFIG).read_text())]
    docs += [(b.where, b.text) for b in of_kind("agentgateway")]
    for where, text in docs:
        for env in (AGW_ENV, {"LLM_BASE_URL": "", "OPENAI_API_KEY": "", **AGW_ENV}):
            cfg = yaml.safe_load(agentgateway_expand(text, env))
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(cfg)]
            assert errors == [], (where, env)


# The AgentgatewayPolicy fields these blocks use (controller/api/v1alpha1/agentgateway/agentgateway_policy_types.go:
# `Tracing`, `PolicyBackendEndpoint`, `LogTracingAttributes`, `AttributeAdd`; group agentgateway.dev).
K8S_SPEC = {"targetRefs", "targetSelectors", "strategy", "frontend", "traffic", "backend"}
K8S_TRACING = {"backendRef", "url", "protocol", "path", "attributes", "resources", "randomSampling"}
K8S_TRACING |= {"clientSampling", "filter"}


@pytest.mark.parametrize("block", of_kind("kubernetes"), ids=lambda b: b.where)
def test_kubernetes_policy_blocks_use_the_crd_fields(block: Block) -> None:
    doc = block.load()
    assert (doc["apiVersion"], doc["kind"]) == ("agentgateway.dev/v1alpha1", "AgentgatewayPolicy")
    spec = doc["spec"]
    assert set(spec) <= K8S_SPEC
    assert all(t["kind"] == "Gateway" for t in spec["targetRefs"])  # a frontend policy targets Gateways only
    tracing = spec["frontend"]["tracing"]
    assert set(tracing) <= K8S_TRACING
    assert len({"backendRef", "url"} & set(tracing)) == 1
    assert tracing.get("protocol", "GRPC") in ("GRPC", "HTTP")
    for key in ("randomSampling", "clientSampling", "filter"):
        assert key not in tracing or isinstance(tracing[key], str), f"{key} is a CEL expression string"
    attributes = tracing.get("attributes") or {}
    assert set(attributes) <= {"add", "remove"}
    assert all(set(a) == {"name", "expression"} for a in attributes.get("add", []))
    if "backendRef" in tracing:
        assert tracing["backendRef"]["port"] == {"GRPC": 4317, "HTTP": 4318}[tracing.get("protocol", "GRPC")]
    # the CRD's tracing has no header field: the traces go through deploy/kubernetes' load-balancing tier, whose
    # exporter adds evalsi's key (tests/deploy/test_manifests.py checks that key against the replicas' hash)
    ref = tracing["backendRef"]
    manifests = [d for f in (ROOT / "deploy/kubernetes").glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    (service,) = [d for d in manifests if d["kind"] == "Service" and d["metadata"]["name"] == ref["name"]]
    assert ref["name"] == "otelcol-lb" and ref["namespace"] == service["metadata"]["namespace"]
    assert ref["port"] in {p["port"] for p in service["spec"]["ports"]}


# --- metrics --------------------------------------------------------------------------------------------------------


def metric(c: Collector, name: str, **labels: str) -> float:
    """A sample summed over the series matching `labels`, from the collector's /metrics."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(c.metrics, headers=KEY_HEADERS).text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def traces_of(c: Collector, service: str) -> dict[str, int]:
    listed = httpx.get(
        c.api + "/api/v1/traces", params={"service": service, "limit": 10_000}, headers=KEY_HEADERS
    ).json()["traces"]
    return {t["trace_id"]: t["span_count"] for t in listed}


def wait_stored(c: Collector, n: int, timeout: float = 30) -> int:
    """`Collector.wait_stored`, reading with the key: the first count of stored spans that reaches n (or the last)."""
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline:
        listed = httpx.get(c.api + "/api/v1/traces", params={"limit": 10_000}, headers=KEY_HEADERS).json()["traces"]
        got = sum(t["span_count"] for t in listed)
        if got >= n:
            return got
        time.sleep(0.1)
    return got


def spans_of(c: Collector, trace_id: str) -> dict[str, dict[str, Any]]:
    resp = httpx.get(f"{c.api}/api/v1/traces/{trace_id}", headers=KEY_HEADERS)
    assert resp.status_code == 200, resp.text
    return {s["span_id"]: s for s in resp.json()["spans"]}


# --- an app configured by docs/otel-sdk.md's environment variables ---------------------------------------------------

SDK_BLOCKS = [
    b for b in blocks("docs/otel-sdk.md", "bash") if re.search(r"^export OTEL_EXPORTER_OTLP_\w*ENDPOINT=", b.text, re.M)
]
# what `opentelemetry-instrument` sets before configuring the SDK, with opentelemetry-distro installed
# (opentelemetry-python-contrib opentelemetry-distro/src/opentelemetry/distro/__init__.py: os.environ.setdefault)
DISTRO_DEFAULTS = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
}
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."


def doc_env(block: Block, shell: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a block exports, `${VAR}` expanded from `shell` as the shell would (the app's environment holds
    EVALSI_API_KEY)."""
    env = {}
    for line in block.text.splitlines():
        m = re.match(r"export (\w+)=(\S*)", line.strip())
        if m:
            value = m.group(2).strip("'\"")
            env[m.group(1)] = re.sub(r"\$\{(\w+)\}", lambda v: (shell or {}).get(v.group(1), v.group(0)), value)
    return env


def _block_id(block: Block) -> str:
    return block.text.splitlines()[0].lstrip("# ")


def _send_agent_run(span_exporter: SpanExporter, log_exporter: Any) -> tuple[str, dict[str, str]]:
    """An agent run as an OTel GenAI instrumentation in its default mode emits it: the chat span without content, the
    prompt and completion as `gen_ai.*` log records in the chat span's context. The resource comes from the
    environment (`Resource.create()` reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES)."""
    resource = Resource.create()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    tracer = tracer_provider.get_tracer("opentelemetry.instrumentation.openai_v2")
    logger = logger_provider.get_logger("opentelemetry.instrumentation.openai_v2")
    with tracer.start_as_current_span("invoke_agent geo") as agent:
        agent.set_attribute("gen_ai.operation.name", "invoke_agent")
        agent.set_attribute("gen_ai.agent.name", "geo")
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT) as chat:
            chat.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system": "openai",
                    "gen_ai.request.model": "gpt-4o-mini",
                    "gen_ai.usage.input_tokens": 14,
                    "gen_ai.usage.output_tokens": 7,
                }
            )
            context = trace_api.set_span_in_context(chat)
            logger.emit(
                context=context,
                event_name="gen_ai.user.message",
                body={"content": QUESTION},
                attributes={"gen_ai.system": "openai"},
            )
            logger.emit(
                context=context,
                event_name="gen_ai.choice",
                body={"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ANSWER}},
                attributes={"gen_ai.system": "openai"},
            )
        with tracer.start_as_current_span("execute_tool lookup") as tool:
            tool.set_attribute("gen_ai.operation.name", "execute_tool")
            tool.set_attribute("gen_ai.tool.name", "lookup")
    ids = {
        "agent": format(agent.get_span_context().span_id, "016x"),
        "chat": format(chat.get_span_context().span_id, "016x"),
        "tool": format(tool.get_span_context().span_id, "016x"),
    }
    assert tracer_provider.force_flush(10_000) and logger_provider.force_flush(10_000)
    tracer_provider.shutdown()
    logger_provider.shutdown()
    return format(agent.get_span_context().trace_id, "032x"), ids


@pytest.fixture
def keyed_collector(tmp_path: Path) -> Iterator[Collector]:
    """`evalsi serve` with the test defaults and an `auth` section listing KEY's hash."""
    cfg = serve_config(tmp_path / "store")
    cfg["auth"] = {"api_keys": [{"hash": KEY_HASH, "name": "sdk"}]}
    c = start_collector(tmp_path, cfg)
    yield c
    if c.proc.poll() is None:
        assert c.stop() == 0


def _sent_headers(env: dict[str, str], signal: str) -> str:
    return env.get(f"OTEL_EXPORTER_OTLP_{signal}_HEADERS", env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))


def test_sdk_blocks_are_found() -> None:
    assert len(SDK_BLOCKS) >= 3
    protocols = {
        doc_env(b).get("OTEL_EXPORTER_OTLP_PROTOCOL", doc_env(b).get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
        for b in SDK_BLOCKS
    }
    assert protocols == {"grpc", "http/protobuf"}
    for block in SDK_BLOCKS:  # traces and logs both carry the key, percent-encoded as the Baggage format asks
        env = doc_env(block)
        for signal in ("TRACES", "LOGS"):
            assert "authorization=Bearer%20${EVALSI_API_KEY}" in _sent_headers(env, signal), (_block_id(block), signal)


@pytest.mark.parametrize("block", SDK_BLOCKS, ids=_block_id)
def test_sdk_environment_recipe_reaches_evalsi(
    block: Block, keyed_collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = keyed_collector
    assert httpx.get(collector.api + "/api/v1/traces").status_code == 401, "this evalsi takes nothing without the key"
    env = doc_env(block, shell={"EVALSI_API_KEY": KEY})
    addresses = {"evalsi:4317": collector.grpc, "evalsi:4318": collector.http.removeprefix("http://")}
    for name in [n for n in os.environ if n.startswith(("OTEL_", "OPENINFERENCE_", "TRACELOOP_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        for shown, real in addresses.items():
            value = value.replace(shown, real)
        monkeypatch.setenv(name, value)
    for name, value in DISTRO_DEFAULTS.items():
        if name not in env:
            monkeypatch.setenv(name, value)

    # the SDK's autoconfiguration, as opentelemetry-instrument runs it: exporters chosen by OTEL_*_EXPORTER and the
    # protocol variables, each built with no arguments (so endpoint, headers and compression come from the env)
    assert _get_exporter_names("metrics") == []  # OTEL_METRICS_EXPORTER=none: evalsi takes no metrics
    span_classes, _, log_classes = _import_exporters(_get_exporter_names("traces"), [], _get_exporter_names("logs"))
    [span_class], [log_class] = span_classes.values(), log_classes.values()
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"))
    transport = "grpc" if protocol == "grpc" else "http"
    assert span_class.__module__.startswith(f"opentelemetry.exporter.otlp.proto.{transport}")
    assert log_class.__module__.startswith(f"opentelemetry.exporter.otlp.proto.{transport}")

    trace_id, ids = _send_agent_run(span_class(), log_class())

    service = env["OTEL_SERVICE_NAME"]
    assert wait_stored(collector, 3) == 3

    def content_joined() -> bool:
        chat = spans_of(collector, trace_id).get(ids["chat"])
        return bool(chat and chat["content_captured"] and chat["input"] and chat["output"])

    # the chat span went on before its log records came: they revise it (the stored row is replaced)
    assert wait_until(content_joined, timeout=30), spans_of(collector, trace_id)
    assert traces_of(collector, service) == {trace_id: 3}
    spans = spans_of(collector, trace_id)
    assert set(spans) == set(ids.values())
    expected_resource = dict(kv.split("=", 1) for kv in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",") if kv)
    for span in spans.values():
        assert span["service_name"] == service
        assert span["resource_attributes"]["service.name"] == service
        assert expected_resource.items() <= span["resource_attributes"].items()
    assert spans[ids["chat"]]["step_type"] == "llm" and spans[ids["tool"]]["tool_name"] == "lookup"
    chat = spans[ids["chat"]]
    assert chat["input"][-1]["parts"][0]["content"] == QUESTION
    assert chat["output"][0]["parts"][0]["content"] == ANSWER

    # every span and log record sent was accepted, over the transport the variables chose, and none refused
    assert metric(collector, "otelcol_receiver_accepted_spans_total", transport=transport) == 3
    assert metric(collector, "otelcol_receiver_accepted_log_records_total", transport=transport) == 2
    assert metric(collector, "otelcol_receiver_refused_spans_total") == 0
    assert metric(collector, "otelcol_receiver_refused_log_records_total") == 0


# --- one evalsi teeing into another through its otlp exporter --------------------------------------------------------

TRACES = 12
SPANS_PER_TRACE = 3
INPUT = [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
OUTPUT = [{"role": "assistant", "parts": [{"type": "text", "content": ANSWER}], "finish_reason": "stop"}]


@pytest.fixture(scope="module")
def downstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    """evalsi B: the backend the tee forwards to, shared by both transports (each test reads its own service); it
    takes only requests with KEY."""
    tmp = tmp_path_factory.mktemp("downstream")
    cfg = serve_config(tmp / "store")
    cfg["auth"] = {"api_keys": [{"hash": KEY_HASH, "name": "evalsi-a"}]}
    c = start_collector(tmp, cfg)
    yield c
    if c.proc.poll() is None:
        c.stop()


def _send_runs(exporter: SpanExporter, service: str) -> None:
    """`TRACES` agent runs with content on the spans (evalsi's otlp exporter forwards spans, not log records)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service, "deployment.environment.name": "ci"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tee.app", "2.0.0")
    for i in range(TRACES):
        with tracer.start_as_current_span(f"invoke_agent run-{i}") as agent:
            agent.set_attribute("gen_ai.operation.name", "invoke_agent")
            agent.set_attribute("gen_ai.conversation.id", f"conv-{i}")
            with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT) as chat:
                chat.set_attributes(
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o-mini",
                        "gen_ai.usage.input_tokens": 10 + i,
                        "gen_ai.usage.output_tokens": 3,
                        "gen_ai.input.messages": json.dumps(INPUT),
                        "gen_ai.output.messages": json.dumps(OUTPUT),
                    }
                )
                chat.add_event("gen_ai.content.filtered", {"reason": "none"})
            with tracer.start_as_current_span("execute_tool lookup") as tool:
                tool.set_attribute("gen_ai.operation.name", "execute_tool")
                tool.set_attribute("gen_ai.tool.name", "lookup")
                tool.set_status(trace_api.Status(trace_api.StatusCode.ERROR, "lookup timed out"))
    assert provider.force_flush(10_000)
    provider.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_evalsi_tees_into_evalsi_through_its_otlp_exporter(
    protocol: str, downstream: Collector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """evalsi A stores what it receives and forwards it with its `otlp` exporter to evalsi B: B lists the same traces
    with the same spans, field for field, and the counters on both sides agree that nothing was lost."""
    transport = "grpc" if protocol == "grpc" else "http"
    service = f"tee-{transport}"
    cfg = serve_config(tmp_path / "store")
    cfg["exporters"]["otlp/downstream"] = {
        "endpoint": downstream.grpc if protocol == "grpc" else downstream.http,
        "protocol": protocol,
        "flush_interval": "100ms",
        "headers": {"authorization": "Bearer ${env:EVALSI_API_KEY}"},  # B's key, from A's environment
    }
    monkeypatch.setenv("EVALSI_API_KEY", KEY)  # `evalsi serve` inherits it
    cfg["service"]["pipelines"]["traces"]["exporters"] = ["clickhouse", "otlp/downstream"]
    before = {
        "accepted": metric(downstream, "otelcol_receiver_accepted_spans_total", transport=transport),
        "refused": metric(downstream, "otelcol_receiver_refused_spans_total"),
    }
    upstream = start_collector(tmp_path, cfg)
    try:
        exporter: SpanExporter = (
            GrpcSpanExporter(endpoint=upstream.grpc, insecure=True)
            if protocol == "grpc"
            else HttpSpanExporter(endpoint=upstream.http + "/v1/traces")
        )
        _send_runs(exporter, service)
        sent = TRACES * SPANS_PER_TRACE

        assert upstream.wait_stored(sent) == sent
        assert wait_until(lambda: sum(traces_of(downstream, service).values()) >= sent, timeout=30)
        in_a, in_b = traces_of(upstream, service), traces_of(downstream, service)
        assert len(in_a) == TRACES and set(in_a.values()) == {SPANS_PER_TRACE}
        assert in_b == in_a  # the same trace ids, each with the same span count

        for trace_id in in_a:  # every span arrives as A stored it: ids, times, attributes, resource, canonical fields
            assert spans_of(downstream, trace_id) == spans_of(upstream, trace_id)

        exporter_labels = {"exporter": "otlp/downstream"}
        assert wait_until(lambda: metric(upstream, "otelcol_exporter_sent_spans_total", **exporter_labels) == sent)
        assert metric(upstream, "otelcol_exporter_send_failed_spans_total", **exporter_labels) == 0
        assert metric(upstream, "otelcol_exporter_enqueue_failed_spans_total", **exporter_labels) == 0
        assert metric(upstream, "evalsi_exporter_items_refused_total") == 0
        assert metric(upstream, "otelcol_receiver_accepted_spans_total") == sent
        assert (
            metric(downstream, "otelcol_receiver_accepted_spans_total", transport=transport) - before["accepted"]
            == sent
        )
        assert metric(downstream, "otelcol_receiver_refused_spans_total") == before["refused"]
    finally:
        assert upstream.stop() == 0
