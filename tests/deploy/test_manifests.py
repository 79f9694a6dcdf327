"""The deploy files (Dockerfile, compose stack, Kubernetes manifests, OpenTelemetry Collector configs) and the docs
that show them. Nothing here can build an image or start a container, so they are checked statically: against the
Compose Specification and Kubernetes schemas, against evalsi's own config parser and key check, against the API's
routes, and against each other (ports, names, secrets, API keys, mounts)."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from evalsi.auth import Authenticator, Unauthenticated, gate, hash_of, is_loopback, new_key
from evalsi.collector.api import OPEN_PATHS, build_api
from evalsi.collector.config import Config, ConfigError, listeners, parse_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
K8S = DEPLOY / "kubernetes"
OTELCOL = DEPLOY / "otelcol"
DOCS = [ROOT / "docs" / "deploy.md", ROOT / "docs" / "scale-out.md"]

# The oldest Kubernetes the manifests are meant for, and the newest kubernetes-validate bundles (it bundles
# 1.25.0 to 1.37.0 at the time of writing; `kubernetes_validate.utils.all_versions()` lists them).
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


# --- reading the files ---------------------------------------------------------------------------------------------


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object in deploy/kubernetes, the kustomization itself left out."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    matches = [doc for _, doc in manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name} in deploy/kubernetes, found {len(matches)}"
    return matches[0]


def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())


def interpolate(value: str) -> str:
    """Compose's interpolation as `docker compose up` with no .env does it: `${VAR:-default}` gives the default."""
    value = re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)
    return value.replace("$$", "$")


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list), f"exec form expected: {arguments}"
    return value


def port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def config_ports(config: dict[str, Any]) -> dict[str, int]:
    """The ports an evalsi config listens on, by what they are."""
    protocols = config["receivers"]["otlp"]["protocols"]
    ports = {
        "otlp-grpc": port(protocols["grpc"]["endpoint"]),
        "otlp-http": port(protocols["http"]["endpoint"]),
        "api": port(config["service"]["api"]["endpoint"]),
        "metrics": port(config["service"]["telemetry"]["metrics"]["address"]),
    }
    prometheus = [body for cid, body in config.get("exporters", {}).items() if cid.split("/")[0] == "prometheus"]
    if prometheus:
        ports["scores"] = port(prometheus[0]["endpoint"])
    return ports


def env_references(text: str) -> set[str]:
    """Variables a config needs from the environment: `${env:VAR}` references without a default."""
    return {m.group(1) for m in re.finditer(r"\$\{env:(\w+)\}", text)}


def parse_as_mounted(
    files: dict[str, str], config_path: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Config:
    """Lay files out as the container sees them (container path -> text) under tmp_path and parse the config there,
    relative paths (policy globs) resolved against its directory as `evalsi serve` resolves them."""
    for container_path, text in files.items():
        target = tmp_path / container_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config_file = tmp_path / config_path.lstrip("/")
    return parse_config(yaml.safe_load(config_file.read_text()), source=config_path, base_dir=config_file.parent)


def copy_tree(source: Path, container_dir: str) -> dict[str, str]:
    return {f"{container_dir}/{p.relative_to(source)}": p.read_text() for p in source.rglob("*") if p.is_file()}


# --- API keys ------------------------------------------------------------------------------------------------------

KEY, KEY_HASH = new_key()  # what an operator makes with `evalsi keys new`, for configs that take theirs from a Secret


def collector_expand(text: str, env: dict[str, str]) -> str:
    """The OpenTelemetry Collector's `${env:VAR}` expansion (its env provider)."""
    return re.sub(r"\$\{env:(\w+)\}", lambda m: env[m.group(1)], text)


def accepts(config: Config, authorization: str) -> bool:
    """Whether the key check of a config lets a request with this `Authorization` value in."""
    assert config.auth is not None
    try:
        return Authenticator(config.auth).check(authorization).authenticated
    except Unauthenticated:
        return False


def assert_guarded(config: Config) -> None:
    """What every shipped config must say about keys: an `auth` section that checks one, and every listener other
    machines can reach behind it."""
    assert config.auth is not None, "a config that listens on 0.0.0.0 needs an `auth` section"
    assert config.auth.mode == "strict", f"auth.mode {config.auth.mode}: the shipped configs require a key"
    assert config.auth.api_keys
    assert not accepts(config, f"Bearer {new_key()[0]}"), "a key that is not listed must be refused"
    reachable = [path for path, endpoint in listeners(config.service, config.components) if not is_loopback(endpoint)]
    assert reachable, "the shipped configs listen for other containers"


# --- the image -----------------------------------------------------------------------------------------------------


def test_the_image_runs_evalsi_serve_as_a_non_root_user() -> None:
    stage = final_stage()
    base = stage[0][1]
    arg_defaults = dict(re.findall(r"^(\w+)=(\S+)$", a)[0] for k, a in dockerfile() if k == "ARG" and "=" in a)
    image = re.sub(r"\$\{(\w+)\}", lambda m: arg_defaults[m.group(1)], base)
    assert re.fullmatch(r"python:3\.(1[1-9])-slim(-\w+)?", image), image

    users = [a for k, a in stage if k == "USER"]
    assert users, "the image must not run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and int(user) > 0 and (not group or int(group) > 0)

    assert exec_form(dict(stage)["ENTRYPOINT"]) == ["evalsi", "serve"]
    command = exec_form(dict(stage)["CMD"])
    assert command[0] == "-c"
    copies = {dest: src for k, a in stage if k == "COPY" and not a.startswith("--from") for src, dest in [a.split()]}
    assert command[1] in copies, f"CMD reads {command[1]}, which no COPY puts in the image"


def test_the_image_config_parses_and_listens_where_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = final_stage()
    config_path = exec_form(dict(stage)["CMD"])[1]
    files: dict[str, str] = {}
    for keyword, arguments in stage:
        if keyword == "COPY" and not arguments.startswith("--from"):
            source, destination = arguments.split()
            path = ROOT / source
            files |= copy_tree(path, destination) if path.is_dir() else {destination: path.read_text()}
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for k, a in stage if k == "ENV")))
    assert "EVALSI_API_KEY_HASH" not in env, "the key hash is the operator's, never baked into the image"
    run_env = {"EVALSI_STORE": env["EVALSI_STORE"], "EVALSI_API_KEY_HASH": KEY_HASH}  # docker run -e ...
    config = parse_as_mounted(files, config_path, run_env, tmp_path, monkeypatch)
    assert config.service.api.endpoint.startswith("0.0.0.0:"), "in a container the API must bind every interface"
    assert_guarded(config)
    assert accepts(config, f"Bearer {KEY}")

    exposed = {int(p) for k, a in stage if k == "EXPOSE" for p in a.split()}
    raw = yaml.safe_load(files[config_path])
    assert set(config_ports(raw).values()) <= exposed

    # the embedded store lives on the declared volume
    volumes = [v for k, a in stage if k == "VOLUME" for v in exec_form(a)]
    store = env["EVALSI_STORE"].removeprefix("chdb://")
    assert env["EVALSI_STORE"].startswith("chdb:///") and any(store.startswith(v + "/") for v in volumes)
    workdir = [a for k, a in stage if k == "WORKDIR"][-1]
    assert workdir in volumes, "relative paths (promoted datasets) should land on the volume too"


def test_the_image_refuses_to_start_without_a_key_hash_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = final_stage()
    config_path = exec_form(dict(stage)["CMD"])[1]
    copies = {a.split()[1]: a.split()[0] for k, a in stage if k == "COPY" and not a.startswith("--from")}
    monkeypatch.delenv("EVALSI_API_KEY_HASH", raising=False)
    with pytest.raises(ConfigError) as refused:
        parse_config(yaml.safe_load((ROOT / copies[config_path]).read_text()), source=config_path)
    [error] = refused.value.errors
    assert error.startswith("auth.api_keys.0.hash: environment variable EVALSI_API_KEY_HASH is not set"), error


def open_api(config: Config) -> Any:
    """The API as `evalsi serve` runs it with this config: behind its key check, the probes left open."""
    assert config.auth is not None
    return gate(build_api(None, status=dict), Authenticator(config.auth), surface="api", open_paths=OPEN_PATHS)


def test_the_healthcheck_asks_a_path_the_api_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    stage = final_stage()
    healthcheck = dict(stage)["HEALTHCHECK"]
    command = healthcheck.split(" CMD ", 1)[1]
    assert "curl" not in command and "wget" not in command, "the slim image has neither"
    url = re.search(r"http://127\.0\.0\.1:\d+/[\w/]*", command)
    assert url, command
    parts = urlsplit(url.group(0))
    config_path = exec_form(dict(stage)["CMD"])[1]
    copies = {a.split()[1]: a.split()[0] for k, a in stage if k == "COPY" and not a.startswith("--from")}
    image_config = yaml.safe_load((ROOT / copies[config_path]).read_text())
    assert parts.port == config_ports(image_config)["api"]
    monkeypatch.setenv("EVALSI_API_KEY_HASH", KEY_HASH)
    monkeypatch.setenv("EVALSI_STORE", "chdb://store")
    client = TestClient(open_api(parse_config(image_config)))
    assert client.get(parts.path).status_code == 200, "the health check sends no key"
    assert client.get("/api/v1/status").status_code == 401, "the rest of the API needs one"


def test_the_build_context_keeps_local_state_out() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", "an allowlist: everything is left out unless let in"
    let_in = [p[1:] for p in patterns if p.startswith("!")]
    for keyword, arguments in dockerfile():
        if keyword == "COPY" and not arguments.startswith("--from"):
            for source in arguments.split()[:-1]:
                source = source.rstrip("/")
                if source != ".":
                    assert any(source == p or source.startswith(p + "/") for p in let_in), f"COPY {source}"
    for generated in (".venv", ".git", "**/.evalsi", "**/__pycache__", "**/.pytest_cache", "**/.ruff_cache"):
        assert generated in patterns
    assert not any(p.startswith((".venv", ".git", ".evalsi")) for p in let_in)


# --- compose -------------------------------------------------------------------------------------------------------


def compose_schema() -> dict[str, Any]:
    import check_jsonschema

    vendored = Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(vendored.read_text())


def schema_errors(schema: dict[str, Any], document: Any) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)
    checker = validator(schema, format_checker=validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in checker.iter_errors(document)]


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = compose_schema()
    assert schema_errors(schema, compose()) == []
    assert schema_errors(schema, yaml.safe_load(interpolate((COMPOSE_DIR / "compose.yaml").read_text()))) == []

    misspelled = compose()
    misspelled["services"]["evalsi"]["stop_grace_periode"] = "45s"
    assert schema_errors(schema, misspelled), "the schema must catch an unknown key, or it checks nothing"


def test_one_command_starts_the_stack() -> None:
    services = compose()["services"]
    default = {name for name, service in services.items() if "profiles" not in service}
    assert default == {"clickhouse", "evalsi", "alertmanager", "prometheus", "grafana"}
    assert services["otelcol"]["profiles"] == ["otelcol"]
    assert services["agentgateway"]["profiles"] == ["agentgateway"]

    evalsi = services["evalsi"]
    assert (COMPOSE_DIR / evalsi["build"]["context"] / evalsi["build"]["dockerfile"]).resolve() == ROOT / "Dockerfile"
    assert evalsi["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    assert "healthcheck" in services["clickhouse"]
    grafana = services["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    # a value without a default would make `docker compose up -d` need a .env first
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            for reference in re.findall(r"\$\{(\w+)([^}]*)\}", str(value)):
                assert reference[1].startswith((":-", "-")), f"{name}.environment.{key} needs {reference[0]}"


def test_the_compose_mounts_exist() -> None:
    missing = []
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                path = (COMPOSE_DIR / source).resolve()
                if not path.exists():
                    missing.append((name, path))
    assert missing == []


def test_the_grafana_and_agentgateway_mounts_are_where_those_parts_expect_them() -> None:
    services = compose()["services"]
    grafana = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert grafana["../grafana/provisioning"] == "/etc/grafana/provisioning"
    assert grafana["../grafana/dashboards"] == "/var/lib/grafana/dashboards"
    agentgateway = services["agentgateway"]
    assert "../agentgateway/config.yaml:/config.yaml:ro" in agentgateway["volumes"]
    assert agentgateway["command"] == ["-f", "/config.yaml"]
    otelcol = services["otelcol"]
    assert "../otelcol/tee.yaml:/etc/otelcol-contrib/config.yaml:ro" in otelcol["volumes"]


def compose_evalsi_files() -> tuple[dict[str, str], str]:
    """The compose evalsi service's bind mounts as the container sees them, and the config path it runs."""
    evalsi = compose()["services"]["evalsi"]
    files: dict[str, str] = {}
    for volume in evalsi["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            path = COMPOSE_DIR / source
            files |= copy_tree(path, target) if path.is_dir() else {target: path.read_text()}
    return files, evalsi["command"][1]


def compose_environment(service: str) -> dict[str, str]:
    """A compose service's environment as `docker compose up` with no .env gives it."""
    return {k: interpolate(str(v)) for k, v in (compose()["services"][service].get("environment") or {}).items()}


def test_the_compose_evalsi_config_parses_as_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, config_path = compose_evalsi_files()
    environment = compose_environment("evalsi")
    assert env_references(files[config_path]) <= set(environment)
    config = parse_as_mounted(files, config_path, environment, tmp_path, monkeypatch)
    assert_guarded(config)
    clickhouse = next(c for (kind, cid), c in config.components.items() if kind == "exporter" and cid == "clickhouse")
    assert urlsplit(clickhouse.endpoint).hostname == "clickhouse"
    assert clickhouse.database == compose()["services"]["clickhouse"]["environment"]["CLICKHOUSE_DB"]


DEMO_MARK = "demo: replace with `evalsi keys new`"


def env_file() -> dict[str, str]:
    lines = (COMPOSE_DIR / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_the_compose_demo_key_is_marked_and_is_the_key_of_the_demo_hash() -> None:
    evalsi = compose_environment("evalsi")
    demo_key, demo_hash = evalsi["EVALSI_API_KEY"], evalsi["EVALSI_API_KEY_HASH"]
    assert demo_hash == hash_of(demo_key), "the compose default hash must be the sha256 of the default key"
    assert demo_key.startswith("evk_demo"), "a demo key says so in its value, in logs and configs"
    # one pair everywhere: .env.example (a copied .env changes nothing until edited) and every service's default
    assert {k: v for k, v in env_file().items() if k.startswith("EVALSI_API_KEY")} == {
        "EVALSI_API_KEY": demo_key,
        "EVALSI_API_KEY_HASH": demo_hash,
    }
    senders = {name: compose_environment(name).get("EVALSI_API_KEY") for name in ("evalsi", "otelcol", "agentgateway")}
    assert senders == dict.fromkeys(senders, demo_key)
    for path in (COMPOSE_DIR / "compose.yaml", COMPOSE_DIR / ".env.example"):
        text = path.read_text()
        for line_no, line in enumerate(text.splitlines()):
            if "evk_demo" in line or demo_hash in line:
                before = "\n".join(text.splitlines()[max(0, line_no - 4) : line_no + 1])
                assert DEMO_MARK in before, f"{path.name}:{line_no + 1}: the demo pair must be marked {DEMO_MARK!r}"


def test_the_compose_senders_send_a_key_the_compose_evalsi_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, config_path = compose_evalsi_files()
    config = parse_as_mounted(files, config_path, compose_environment("evalsi"), tmp_path, monkeypatch)

    # the otelcol profile: tee.yaml's evalsi exporter header, expanded from the otelcol service's environment
    mounted = [v.split(":")[0] for v in compose()["services"]["otelcol"]["volumes"]]
    (tee_path,) = [COMPOSE_DIR / m for m in mounted if m.endswith(".yaml")]
    tee = yaml.safe_load(collector_expand(tee_path.read_text(), compose_environment("otelcol")))
    (exporter,) = [e for cid, e in tee["exporters"].items() if cid.endswith("/evalsi")]
    assert accepts(config, exporter["headers"]["authorization"])

    # the agentgateway profile: its tracing policy's backendAuth key, sent as `Bearer <key>`
    from test_recipes import agentgateway_expand

    gateway = compose()["services"]["agentgateway"]
    (source,) = [v.split(":")[0] for v in gateway["volumes"] if v.endswith(":/config.yaml:ro")]
    text = (COMPOSE_DIR / source).read_text()
    gateway_config = yaml.safe_load(agentgateway_expand(text, compose_environment("agentgateway")))
    key = gateway_config["frontendPolicies"]["tracing"]["policies"]["backendAuth"]["key"]
    assert accepts(config, f"Bearer {key}")

    # the CLI inside the evalsi container (`docker compose exec evalsi evalsi ...` in docs/deploy.md)
    assert accepts(config, f"Bearer {compose_environment('evalsi')['EVALSI_API_KEY']}")


def test_the_compose_ports_are_the_config_ports() -> None:
    files, config_path = compose_evalsi_files()
    ports = config_ports(yaml.safe_load(files[config_path]))
    published = {p["name"]: p["target"] for p in compose()["services"]["evalsi"]["ports"]}
    assert published == ports
    assert all(interpolate(p["host_ip"]) == "127.0.0.1" for p in compose()["services"]["evalsi"]["ports"])

    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {f"evalsi:{ports['metrics']}", f"evalsi:{ports['scores']}"}
    assert "--enable-feature=exemplar-storage" in compose()["services"]["prometheus"]["command"]

    host_ports = [
        (interpolate(p["host_ip"]), p["published"]) for s in compose()["services"].values() for p in s.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"


# --- Kubernetes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_each_manifest_validates(path: str, version: str) -> None:
    documents = [d for d in yaml.safe_load_all((K8S / path).read_text()) if d]
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_catches_an_unknown_field() -> None:
    deployment = copy.deepcopy(k8s_object("Deployment", "evalsi"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    shipped = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == shipped
    namespace = kustomization["namespace"]
    for _, doc in manifests():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, "namespaced too, for `kubectl apply -f` without kustomize"
    assert {i["name"] for i in kustomization["images"]} == {"evalsi"}


ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected"}
ALLOWED_VOLUMES |= {"secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What breaks the PodSecurity `restricted` profile (the baseline checks it includes, and its own)."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']} is {kinds}")
    for container in pod.get("initContainers", []) + pod["containers"]:
        name = container["name"]
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds {capabilities['add']}")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot must be true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


def workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, doc in manifests():
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def test_every_pod_meets_podsecurity_restricted() -> None:
    assert {name for name, _ in workloads()} == {
        "Deployment/evalsi", "Deployment/otelcol-lb", "StatefulSet/clickhouse", "Deployment/alertmanager"
    }  # fmt: skip
    for name, pod in workloads():
        assert restricted_violations(pod) == [], name
    namespace = k8s_object("Namespace", "evalsi")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    broken = copy.deepcopy(k8s_object("Deployment", "evalsi")["spec"]["template"]["spec"])
    broken["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    assert len(restricted_violations(broken)) == 2, "the check must see what it checks"


def evalsi_pod() -> dict[str, Any]:
    return k8s_object("Deployment", "evalsi")["spec"]["template"]["spec"]


def test_the_evalsi_pod_security_context_field_by_field() -> None:
    pod = evalsi_pod()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] > 0
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    # the image's user, so files the image put on the volume stay writable
    user = next(a for k, a in final_stage() if k == "USER").split(":")[0]
    assert context["runAsUser"] == int(user)

    # with a read-only root, what evalsi writes must be a volume: /tmp, and the working directory
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    workdir = [a for k, a in final_stage() if k == "WORKDIR"][-1]
    for writable in ("/tmp", workdir):
        assert "emptyDir" in volumes[mounts[writable]], writable
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}


def k8s_evalsi_files() -> tuple[dict[str, str], str]:
    """The evalsi ConfigMap as the pod sees it (one file per key in the mounted directory), and the config path."""
    (container,) = evalsi_pod()["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in evalsi_pod()["volumes"]}
    files: dict[str, str] = {}
    for name, volume in volumes.items():
        if "configMap" in volume:
            data = k8s_object("ConfigMap", volume["configMap"]["name"])["data"]
            files |= {f"{mounts[name]}/{key}": text for key, text in data.items()}
    args = container["args"]
    return files, args[args.index("-c") + 1]


# what an operator puts in the Secrets secret.example.yaml shows (docs/deploy.md creates them this way)
SECRETS = {
    "evalsi-clickhouse": {"password": "secret-value"},
    "evalsi-api-key": {"api-key": KEY, "api-key-hash": KEY_HASH},
}


POD_IP = "10.244.1.7"
"""The address Kubernetes would give the pod (the Downward API's `status.podIP`)."""


def pod_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment with its Secret references filled from SECRETS."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            assert e["valueFrom"]["fieldRef"] == {"fieldPath": "status.podIP"}, e
            env[e["name"]] = POD_IP
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = SECRETS[ref["name"]][ref["key"]]
    return env


def test_the_configmap_config_parses_as_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, config_path = k8s_evalsi_files()
    (container,) = evalsi_pod()["containers"]
    env = pod_env(container)
    assert env_references(files[config_path]) <= set(env), "every ${env:VAR} the config reads is set in the pod"
    config = parse_as_mounted(files, config_path, env, tmp_path, monkeypatch)
    assert_guarded(config)

    clickhouse = next(c for (kind, cid), c in config.components.items() if kind == "exporter" and cid == "clickhouse")
    assert clickhouse.endpoint == "http://clickhouse:8123", "replicas cannot share an embedded chDB directory"
    assert k8s_object("Deployment", "evalsi")["spec"]["replicas"] > 1
    cpu_limit = int(container["resources"]["limits"]["cpu"])
    assert config.service.workers == cpu_limit, "workers: auto would count the node's CPUs, not the pod's quota"
    # the replica set: the headless Service the routing tier resolves, each pod named by its address there
    evaluate = next(c for (kind, cid), c in config.components.items() if kind == "processor" and cid == "evaluate")
    headless = k8s_object("Service", "evalsi-headless")
    namespace = headless["metadata"]["namespace"]
    assert evaluate.replicas.dns == f"evalsi-headless.{namespace}.svc.cluster.local"
    assert evaluate.replicas.self_ == POD_IP


def test_the_evalsi_services_and_probes_match_the_config() -> None:
    files, config_path = k8s_evalsi_files()
    ports = config_ports(yaml.safe_load(files[config_path]))
    (container,) = evalsi_pod()["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports == ports

    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api"}
    assert container["startupProbe"]["httpGet"]["port"] == "api"

    service = k8s_object("Service", "evalsi")
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == ports
    headless = k8s_object("Service", "evalsi-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert [(p["port"], p["targetPort"]) for p in headless["spec"]["ports"]] == [(ports["otlp-grpc"], "otlp-grpc")]
    labels = k8s_object("Deployment", "evalsi")["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"], headless["spec"]["selector"]):
        assert selector.items() <= labels.items()


def test_the_probe_paths_are_served_by_the_api_without_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    files, config_path = k8s_evalsi_files()
    (container,) = evalsi_pod()["containers"]
    client = TestClient(open_api(parse_as_mounted(files, config_path, pod_env(container), tmp_path, monkeypatch)))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert "httpHeaders" not in container[probe]["httpGet"], "a probe sends no key"
        assert client.get(container[probe]["httpGet"]["path"]).status_code == 200, probe


def secret_references() -> dict[str, set[tuple[str, str]]]:
    """(Secret, key) pairs each workload's containers read, by workload."""
    return {
        name: {
            (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for c in pod["containers"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        for name, pod in workloads()
    }


def test_every_secret_a_pod_reads_is_in_the_example() -> None:
    examples = {d["metadata"]["name"]: d for d in yaml.safe_load_all((K8S / "secret.example.yaml").read_text()) if d}
    assert set(examples) == set(SECRETS) == {name for refs in secret_references().values() for name, _ in refs}
    for refs in secret_references().values():
        assert all(key in examples[name]["stringData"] for name, key in refs)
    for name, example in examples.items():
        assert set(example["stringData"]) == set(SECRETS[name])
        assert set(example["stringData"].values()) == {"REPLACE-ME"}, f"{name}: an example, not a secret"
    # each side gets only its half of the key pair
    assert ("evalsi-api-key", "api-key-hash") in secret_references()["Deployment/evalsi"]
    assert ("evalsi-api-key", "api-key") not in secret_references()["Deployment/evalsi"]
    assert secret_references()["Deployment/otelcol-lb"] == {("evalsi-api-key", "api-key")}


def test_the_clickhouse_password_comes_from_the_secret_the_example_shows() -> None:
    assert ("evalsi-clickhouse", "password") in secret_references()["Deployment/evalsi"]

    files, config_path = k8s_evalsi_files()
    exporter = yaml.safe_load(files[config_path])["exporters"]["clickhouse"]
    server = k8s_object("StatefulSet", "clickhouse")["spec"]["template"]["spec"]["containers"][0]
    server_env = {e["name"]: e.get("value") for e in server["env"]}
    assert (exporter["database"], exporter["username"]) == (server_env["CLICKHOUSE_DB"], server_env["CLICKHOUSE_USER"])
    clickhouse_service = k8s_object("Service", "clickhouse")
    assert urlsplit(exporter["endpoint"]).port in {p["port"] for p in clickhouse_service["spec"]["ports"]}


def test_the_load_balancer_runs_the_shipped_config() -> None:
    config_map = k8s_object("ConfigMap", "otelcol-lb-config")
    assert config_map["data"]["config.yaml"] == (OTELCOL / "loadbalancing.yaml").read_text()

    pod = k8s_object("Deployment", "otelcol-lb")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "otelcol-lb-config")
    assert f"--config={mounts[volume['name']]}/config.yaml" in container["args"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    health = port(config["extensions"]["health_check"]["endpoint"])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["health"] == health


def test_the_load_balancer_sends_the_key_whose_hash_the_replicas_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (lb,) = k8s_object("Deployment", "otelcol-lb")["spec"]["template"]["spec"]["containers"]
    text = k8s_object("ConfigMap", "otelcol-lb-config")["data"]["config.yaml"]
    assert env_references(text) <= set(pod_env(lb)), "every ${env:VAR} the tier's config reads is set in its pod"
    otlp = load_balancer(yaml.safe_load(text))["protocol"]["otlp"]
    assert otlp["headers"] == {"authorization": "Bearer ${env:EVALSI_API_KEY}"}, "a key in git would be public"
    sent = load_balancer(yaml.safe_load(collector_expand(text, pod_env(lb))))["protocol"]["otlp"]["headers"]

    files, config_path = k8s_evalsi_files()
    (container,) = evalsi_pod()["containers"]
    config = parse_as_mounted(files, config_path, pod_env(container), tmp_path, monkeypatch)
    assert accepts(config, sent["authorization"])


def test_the_load_balancer_may_watch_the_headless_service() -> None:
    pod = k8s_object("Deployment", "otelcol-lb")["spec"]["template"]["spec"]
    account = k8s_object("ServiceAccount", pod["serviceAccountName"])
    binding = k8s_object("RoleBinding", "otelcol-lb-resolver")
    assert {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "evalsi"} in binding["subjects"]
    role = k8s_object("Role", binding["roleRef"]["name"])
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    for resource in (("discovery.k8s.io", "endpointslices"), ("", "endpoints")):
        assert granted[resource] >= {"get", "list", "watch"}, resource
    assert all(verbs <= {"get", "list", "watch"} for verbs in granted.values()), "read-only"


# --- OpenTelemetry Collector configs -------------------------------------------------------------------------------

OTELCOL_CONFIGS = sorted(p.name for p in OTELCOL.glob("*.yaml"))
SECTIONS = {"receivers": "receivers", "processors": "processors", "exporters": "exporters"}


def load_balancer(config: dict[str, Any]) -> dict[str, Any]:
    ids = [cid for cid in config["exporters"] if cid.split("/")[0] in ("load_balancing", "loadbalancing")]
    assert len(ids) == 1, ids
    return config["exporters"][ids[0]] | {"id": ids[0]}


@pytest.mark.parametrize("name", OTELCOL_CONFIGS)
def test_each_collector_config_is_coherent(name: str) -> None:
    config = yaml.safe_load((OTELCOL / name).read_text())
    assert set(config) <= {"extensions", "receivers", "processors", "exporters", "connectors", "service"}
    pipelines = config["service"]["pipelines"]
    used: dict[str, set[str]] = {section: set() for section in SECTIONS}
    for pipeline_id, pipeline in pipelines.items():
        assert pipeline_id.split("/")[0] in ("traces", "logs", "metrics"), pipeline_id
        assert pipeline["receivers"] and pipeline["exporters"], pipeline_id
        for section in SECTIONS:
            for cid in pipeline.get(section, []):
                assert cid in (config.get(section) or {}), f"{pipeline_id} lists {cid}, not defined in {section}"
                used[section].add(cid)
    for section in SECTIONS:
        assert set(config.get(section) or {}) == used[section], f"{section} defined but in no pipeline"
    assert set(config["service"].get("extensions", [])) == set(config.get("extensions") or {})


@pytest.mark.parametrize("name", ["tee.yaml", "tee-http.yaml"])
def test_the_tee_keeps_its_pipelines_and_adds_evalsi(name: str) -> None:
    config = yaml.safe_load((OTELCOL / name).read_text())
    evalsi_ids = [cid for cid in config["exporters"] if cid.endswith("/evalsi")]
    assert len(evalsi_ids) == 1
    (evalsi,) = evalsi_ids
    kind = evalsi.split("/")[0]
    exporter = config["exporters"][evalsi]
    compose_config = yaml.safe_load(compose_evalsi_files()[0]["/etc/evalsi/evalsi.yaml"])
    ports = config_ports(compose_config)
    if kind == "otlp_grpc":
        assert exporter["endpoint"] == f"evalsi:{ports['otlp-grpc']}"
    else:
        assert kind == "otlp_http"
        assert exporter["endpoint"] == f"http://evalsi:{ports['otlp-http']}"
    for shown in ("sending_queue", "retry_on_failure", "headers", "tls", "compression"):
        assert shown in exporter, shown
    assert exporter["sending_queue"]["enabled"] is True
    # the key from the collector's environment (compose's otelcol service sets it), never written in the file
    assert exporter["headers"] == {"authorization": "Bearer ${env:EVALSI_API_KEY}"}
    assert env_references((OTELCOL / name).read_text()) == {"EVALSI_API_KEY"}

    pipelines = config["service"]["pipelines"]
    to_evalsi = {p.split("/")[0] for p, body in pipelines.items() if evalsi in body["exporters"]}
    assert to_evalsi == {"traces", "logs"}, "GenAI content log records must reach evalsi with their spans"
    for pipeline in pipelines.values():
        assert set(pipeline["exporters"]) - {evalsi}, "the collector's own exporter stays beside evalsi"


def test_the_load_balancer_routes_by_trace_id_to_the_headless_service() -> None:
    text = (OTELCOL / "loadbalancing.yaml").read_text()
    config = yaml.safe_load(text)
    exporter = load_balancer(config)
    assert exporter["routing_key"] == "traceID"
    headless = k8s_object("Service", "evalsi-headless")
    service = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}"
    assert exporter["resolver"] == {"k8s": {"service": service, "ports": [headless["spec"]["ports"][0]["port"]]}}
    # the DNS alternative, commented out (one resolver at a time), names the same Service
    assert re.search(rf"#\s+dns:\s*\n\s*#\s+hostname: {re.escape(service)}\.svc\.cluster\.local\n", text)
    pipelines = config["service"]["pipelines"]
    assert {p for p, body in pipelines.items() if exporter["id"] in body["exporters"]} == {"traces", "logs"}
    assert "sending_queue" in exporter and "retry_on_failure" in exporter
    assert "endpoint" not in exporter["protocol"]["otlp"], "the resolver gives each replica's endpoint"


def test_the_collector_images_agree() -> None:
    compose_image = compose()["services"]["otelcol"]["image"]
    pod = k8s_object("Deployment", "otelcol-lb")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == compose_image
    assert re.fullmatch(r"otel/opentelemetry-collector-contrib:\d+\.\d+\.\d+", compose_image)


# --- the docs ------------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent> *)```ya?ml\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
WHOLE = re.compile(r"# (deploy/\S+)\n")
EXCERPT = re.compile(r"# excerpt of (deploy/\S+)\n")


def doc_blocks() -> Iterator[tuple[Path, str]]:
    for doc in DOCS:
        for match in FENCE.finditer(doc.read_text()):
            indent = len(match.group("indent"))  # a block inside a list item is indented with it
            yield doc, "".join(line[indent:] for line in match.group("body").splitlines(keepends=True))


def is_subtree(part: Any, whole: Any) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and is_subtree(v, whole[k]) for k, v in part.items())
    return part == whole


def looks_like_a_whole_file(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    return {"service", "exporters"} <= set(block) or {"apiVersion", "kind"} <= set(block) or "services" in block


def test_the_docs_show_the_shipped_files_as_they_are() -> None:
    assert all(doc.exists() for doc in DOCS)
    blocks = list(doc_blocks())
    assert blocks
    checked = 0
    for doc, block in blocks:
        whole, excerpt = WHOLE.match(block), EXCERPT.match(block)
        if whole and (ROOT / whole.group(1)).is_file():
            shipped = (ROOT / whole.group(1)).read_text()
            assert block[whole.end() :] == shipped, f"{doc.name}: the copy of {whole.group(1)} differs from the file"
            checked += 1
        elif excerpt:
            shipped = [d for d in yaml.safe_load_all((ROOT / excerpt.group(1)).read_text()) if d]
            part = yaml.safe_load(block)
            assert any(is_subtree(part, d) for d in shipped), f"{doc.name}: not what {excerpt.group(1)} says"
            checked += 1
        else:
            documents = [d for d in yaml.safe_load_all(block) if d]
            assert not any(looks_like_a_whole_file(d) for d in documents), (
                f"{doc.name}: a whole config written out: start it with `# deploy/PATH` (a shipped file, kept "
                f"identical) or reference the file\n{block[:200]}"
            )
    assert checked >= 2, "the docs show the shipped files they talk about"


def test_the_docs_name_every_shipped_deploy_file() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS)
    shipped = [p for d in (COMPOSE_DIR, K8S, OTELCOL) for p in sorted(d.iterdir()) if p.is_file()]
    shipped += [ROOT / "Dockerfile"]
    for path in shipped:
        assert str(path.relative_to(ROOT)) in text, f"{path.relative_to(ROOT)} is in no deploy doc"


def test_the_docs_commands_name_what_is_shipped() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS).replace("\\\n", " ")  # continuation lines joined
    services = set(compose()["services"])
    commands = re.findall(r"^\s*(?:\$ )?((?:kubectl|docker compose) [^\n]+)", text, re.M)
    assert commands
    for command in commands:
        words = shlex.split(command.split(" #")[0])
        for word in words:
            kind, _, name = word.partition("/")
            if kind in ("deployment", "statefulset", "service", "svc", "configmap") and name:
                kind = {"svc": "service"}.get(kind, kind)
                names = {d["metadata"]["name"] for _, d in manifests() if d["kind"].lower() == kind}
                assert name in names, command
        if words[:2] == ["docker", "compose"]:
            for verb in ("exec", "logs", "restart", "stop"):
                if verb in words:
                    target = [w for w in words[words.index(verb) + 1 :] if not w.startswith("-")]
                    assert not target or target[0] in services, command


def _header_commands(path: Path) -> list[str]:
    """The commands of a file's leading comment: its `#   ` lines."""
    header = [line for line in path.read_text().splitlines()[:20] if line.startswith("#")]
    return [line[4:] for line in header if line.startswith("#   ") and line[4:5] != " "]


def test_the_deploy_config_header_commands_validate_it_as_written(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    commands = _header_commands(DEPLOY / "evalsi.yaml")
    assert commands and commands[-1].startswith("evalsi validate -c deploy/evalsi.yaml"), commands
    shim = tmp_path / "bin" / "evalsi"  # `evalsi` as installed: this interpreter's, this checkout's code
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m evalsi "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALSI_")}
    env["PATH"] = f"{shim.parent}:{env['PATH']}"
    script = "set -e\n" + "\n".join(commands) + '\ntest -n "$EVALSI_API_KEY"\n'
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "deploy/evalsi.yaml" in res.stdout and "invalid" not in res.stdout + res.stderr, res.stdout


def test_validate_says_how_to_set_an_unset_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsi_cli import evalsi_cli

    monkeypatch.delenv("EVALSI_API_KEY_HASH", raising=False)
    res = evalsi_cli("validate", "-c", str(DEPLOY / "evalsi.yaml"))
    assert res.returncode != 0
    [line] = [line for line in (res.stdout + res.stderr).splitlines() if "EVALSI_API_KEY_HASH" in line]
    assert "auth.api_keys.0.hash: environment variable EVALSI_API_KEY_HASH is not set" in line  # which, where
    assert 'eval "$(evalsi keys new --export)"' in line and "export EVALSI_API_KEY_HASH=" in line, line  # how
    (tmp_path / "c.yaml").write_text(
        "receivers: {otlp: {protocols: {http: {endpoint: '${env:EVALSI_TEST_HTTP_ENDPOINT}'}}}}\n"
        "exporters: {debug: {}}\n"
        "service: {pipelines: {traces: {receivers: [otlp], exporters: [debug]}}}\n"
    )
    res = evalsi_cli("validate", "-c", str(tmp_path / "c.yaml"))
    assert (
        "receivers.otlp.protocols.http.endpoint: environment variable EVALSI_TEST_HTTP_ENDPOINT is not set; this key "
        "reads it. Set it first: export EVALSI_TEST_HTTP_ENDPOINT=..."
    ) in res.stdout + res.stderr, res.stdout + res.stderr


# --- Alertmanager --------------------------------------------------------------------------------------------------


AMTOOL = shutil.which("amtool")


@pytest.mark.skipif(AMTOOL is None, reason="no amtool: apt-get install prometheus-alertmanager")
def test_the_alertmanager_configs_pass_amtool(tmp_path: Path) -> None:
    k8s = yaml.safe_load((K8S / "alertmanager.yaml").read_text().split("\n---\n")[0])
    (tmp_path / "k8s.yml").write_text(k8s["data"]["alertmanager.yml"])
    for path in (ROOT / "deploy" / "compose" / "alertmanager.yml", tmp_path / "k8s.yml"):
        checked = subprocess.run([str(AMTOOL), "check-config", str(path)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_replicas_send_alerts_to_the_alertmanager_service_the_manifests_run() -> None:
    config = yaml.safe_load(k8s_object("ConfigMap", "evalsi-config")["data"]["evalsi.yaml"])
    evaluate = config["processors"]["evaluate"]
    assert evaluate["windows"]["scope"] == "store" and evaluate["promote_to"] == "store"
    service = k8s_object("Service", "alertmanager")
    port = service["spec"]["ports"][0]["port"]
    assert evaluate["alertmanager"]["url"] == f"http://{service['metadata']['name']}:{port}"
    policies = list(yaml.safe_load_all(k8s_object("ConfigMap", "evalsi-config")["data"]["policies.yaml"]))
    assert all(p["spec"].get("alerts") and p["spec"].get("promote") for p in policies), "alerts and promotion are back"
    compose_evaluate = yaml.safe_load((ROOT / "deploy" / "compose" / "evalsi.yaml").read_text())["processors"][
        "evaluate"
    ]
    assert (
        compose_evaluate["alertmanager"]["url"] == "http://alertmanager:9093"
        and "alertmanager" in compose()["services"]
    )
