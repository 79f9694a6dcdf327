"""Config loading and `evalsi validate`: laptop defaults, errors that name their key path, `env:` values, and the
messages a user gets when a store is locked by a running collector."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from running_collector import EVALSI, Collector, serve_config, start_collector

from evalsi.collector.config import ConfigError, load_config
from evalsi.exporters.clickhouse import ClickHouseConfig
from evalsi.receivers.otlp.config import OtlpReceiverConfig


def minimal(**exporter: Any) -> dict[str, Any]:
    """A valid config with one otlp receiver and one clickhouse exporter (with `exporter` settings)."""
    return {
        "receivers": {"otlp": None},
        "exporters": {"clickhouse": exporter or None},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
    }


def write(tmp_path: Path, doc: Any, name: str = "evalsi.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def errors_of(tmp_path: Path, doc: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, doc))
    return info.value.errors


def evalsi(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVALSI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


# --- defaults -------------------------------------------------------------------------------------


def test_defaults_without_a_file() -> None:
    cfg = load_config(None)

    otlp = cfg.component("receiver", "otlp")
    assert isinstance(otlp, OtlpReceiverConfig)
    assert otlp.protocols.grpc is not None and otlp.protocols.grpc.endpoint == "127.0.0.1:4317"
    assert otlp.protocols.http is not None and otlp.protocols.http.endpoint == "127.0.0.1:4318"
    assert otlp.protocols.http.max_request_body_size == 20 * 1024 * 1024  # the spec's recommended limit
    store = cfg.component("exporter", "clickhouse")
    assert isinstance(store, ClickHouseConfig)
    assert store.endpoint == "chdb://.evalsi/store"
    assert cfg.service.api.endpoint == "127.0.0.1:8080"
    pipe = cfg.service.pipelines["traces"]
    assert (pipe.receivers, pipe.processors, pipe.exporters) == (["otlp"], ["normalize"], ["clickhouse"])


def test_listed_protocol_is_enabled_with_its_defaults(tmp_path: Path) -> None:
    """As in otelcol: `http:` with no body turns http on (default endpoint) and leaves grpc off."""
    doc = minimal()
    doc["receivers"]["otlp"] = {"protocols": {"http": None}}

    otlp = load_config(write(tmp_path, doc)).component("receiver", "otlp")

    assert isinstance(otlp, OtlpReceiverConfig)
    assert otlp.protocols.grpc is None
    assert otlp.protocols.http is not None and otlp.protocols.http.endpoint == "127.0.0.1:4318"


def test_durations_are_parsed(tmp_path: Path) -> None:
    store = load_config(write(tmp_path, minimal(flush_interval="250ms", timeout="1m30s"))).component(
        "exporter", "clickhouse"
    )
    assert isinstance(store, ClickHouseConfig)
    assert (store.flush_interval, store.timeout) == (0.25, 90.0)


# --- errors name their key path -------------------------------------------------------------------


def test_invalid_duration(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, minimal(flush_interval="5x"))

    assert len(errors) == 1
    assert errors[0].startswith("exporters.clickhouse.flush_interval: ")
    assert "invalid duration '5x'" in errors[0]


def test_unknown_keys(tmp_path: Path) -> None:
    doc = minimal()
    doc["receivers"]["otlp"] = {"protocols": {"http": {"max_body": 5}}}
    assert errors_of(tmp_path, doc) == ["receivers.otlp.protocols.http.max_body: unknown key"]

    doc = minimal()
    doc["service"]["telemetri"] = {}
    assert errors_of(tmp_path, doc) == ["service.telemetri: unknown key"]


def test_unknown_component_type(tmp_path: Path) -> None:
    doc = minimal()
    doc["receivers"]["jaeger/legacy"] = {}

    [error] = errors_of(tmp_path, doc)

    assert error.startswith("receivers.jaeger/legacy: unknown receiver type 'jaeger'")
    assert "otlp" in error  # lists what is known


def test_pipeline_referencing_undefined_component(tmp_path: Path) -> None:
    doc = minimal()
    doc["service"]["pipelines"]["traces"]["processors"] = ["batch"]
    doc["service"]["pipelines"]["traces"]["exporters"] = ["clickhouse", "clickhouse/archive"]

    errors = errors_of(tmp_path, doc)

    assert sorted(errors) == [
        "service.pipelines.traces.exporters.1: exporter 'clickhouse/archive' is not defined in exporters",
        "service.pipelines.traces.processors.0: processor 'batch' is not defined in processors",
    ]


def test_several_errors_reported_at_once(tmp_path: Path) -> None:
    doc = minimal(flush_interval="5x", endpoint="mysql://db")
    doc["receivers"]["otlp"] = {"protocols": {"grpc": {"endpoint": "localhost"}}}
    doc["receivers"]["zipkin"] = None
    doc["service"]["pipelines"]["traces"]["processors"] = ["batch"]

    errors = errors_of(tmp_path, doc)

    paths = sorted(e.split(": ", 1)[0] for e in errors)
    assert paths == [
        "exporters.clickhouse.endpoint",
        "exporters.clickhouse.flush_interval",
        "receivers.otlp.protocols.grpc.endpoint",
        "receivers.zipkin",
        "service.pipelines.traces.processors.0",
    ]


def test_service_error_does_not_hide_component_errors(tmp_path: Path) -> None:
    doc = minimal(flush_interval="5x")
    doc["service"]["telemetri"] = {}

    paths = sorted(e.split(": ", 1)[0] for e in errors_of(tmp_path, doc))

    assert paths == ["exporters.clickhouse.flush_interval", "service.telemetri"]


def test_not_a_mapping_and_not_yaml(tmp_path: Path) -> None:
    assert "must be a mapping" in errors_of(tmp_path, "- a\n- list\n")[0]
    assert "not valid YAML" in errors_of(tmp_path, "receivers: [unclosed\n")[0]
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert "cannot read" in info.value.errors[0] and "missing.yaml" in info.value.errors[0]


# --- env: values ----------------------------------------------------------------------------------


def test_env_value_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSI_TEST_CH_PASSWORD", "s3cret")
    monkeypatch.setenv("EVALSI_TEST_STORE_DIR", str(tmp_path / "from-env"))
    doc = minimal(password="env:EVALSI_TEST_CH_PASSWORD", endpoint="chdb://${env:EVALSI_TEST_STORE_DIR}/store")

    store = load_config(write(tmp_path, doc)).component("exporter", "clickhouse")

    assert isinstance(store, ClickHouseConfig)
    assert store.password == "s3cret"
    assert store.endpoint == f"chdb://{tmp_path}/from-env/store"


def test_env_missing_is_named_with_its_key_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_UNSET", raising=False)
    monkeypatch.delenv("EVALSI_TEST_UNSET_2", raising=False)
    doc = minimal(password="env:EVALSI_TEST_UNSET", database="${env:EVALSI_TEST_UNSET_2}")

    errors = errors_of(tmp_path, doc)

    for want in (
        "exporters.clickhouse.password: environment variable EVALSI_TEST_UNSET is not set; this key reads it. Set it "
        "first: export EVALSI_TEST_UNSET=",
        "exporters.clickhouse.database: environment variable EVALSI_TEST_UNSET_2 is not set; this key reads it. Set "
        "it first: export EVALSI_TEST_UNSET_2=...",
    ):
        assert any(e.startswith(want) for e in errors), (want, errors)


def test_env_missing_is_reported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_UNSET", raising=False)

    errors = errors_of(tmp_path, minimal(password="env:EVALSI_TEST_UNSET"))

    [error] = errors
    assert error.startswith("exporters.clickhouse.password: environment variable EVALSI_TEST_UNSET is not set"), error


def test_env_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_DB", raising=False)
    doc = minimal(database="${env:EVALSI_TEST_DB:-traces_db}", flush_interval="${EVALSI_TEST_FLUSH:-250ms}")
    monkeypatch.delenv("EVALSI_TEST_FLUSH", raising=False)

    store = load_config(write(tmp_path, doc)).component("exporter", "clickhouse")
    assert isinstance(store, ClickHouseConfig)
    assert (store.database, store.flush_interval) == ("traces_db", 0.25)

    monkeypatch.setenv("EVALSI_TEST_DB", "from_env")
    store = load_config(write(tmp_path, doc)).component("exporter", "clickhouse")
    assert isinstance(store, ClickHouseConfig)
    assert store.database == "from_env"


# --- evalsi validate ------------------------------------------------------------------------------


def test_validate_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, serve_config(tmp_path / "store"))

    res = evalsi("validate", "-c", str(path), cwd=tmp_path)

    assert res.returncode == 0, res.stderr
    assert f"OK: {path}" in res.stdout
    assert not (tmp_path / "store").exists()  # validating starts nothing, creates no store


def test_validate_bad_file_prints_every_error(tmp_path: Path) -> None:
    doc = minimal(flush_interval="5x")
    doc["receivers"]["otlp"] = {"protocols": {"http": {"max_body": 5}}}
    doc["receivers"]["jaeger"] = None
    doc["service"]["pipelines"]["traces"]["processors"] = ["batch"]
    path = write(tmp_path, doc)

    res = evalsi("validate", "-c", str(path), cwd=tmp_path)

    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert str(path) in out
    for expected in (
        "receivers.otlp.protocols.http.max_body: unknown key",
        "receivers.jaeger: unknown receiver type 'jaeger'",
        "exporters.clickhouse.flush_interval: invalid duration '5x'",
        "service.pipelines.traces.processors.0: processor 'batch' is not defined in processors",
    ):
        assert expected in out
    assert "Traceback" not in out
    assert "OK" not in res.stdout

    # `serve` refuses the same file with the same messages, before starting anything
    res = evalsi("serve", "-c", str(path), cwd=tmp_path)
    assert res.returncode == 1
    assert "exporters.clickhouse.flush_interval: invalid duration '5x'" in res.stderr
    assert "Traceback" not in res.stderr


# --- a store held by a running collector ----------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("locked")
    c = start_collector(tmp, serve_config(tmp / "store"))
    yield c
    c.stop()


def store_of(c: Collector) -> Path:
    return Path(
        yaml.safe_load(c.config_path.read_text())["exporters"]["clickhouse"]["endpoint"].removeprefix("chdb://")
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_on_a_locked_store_fails_fast(running: Collector, tmp_path: Path) -> None:
    path = write(tmp_path, serve_config(store_of(running)))

    t0 = time.monotonic()
    res = evalsi("serve", "-c", str(path), cwd=tmp_path, timeout=60)
    elapsed = time.monotonic() - t0

    assert res.returncode == 1, res.stderr
    assert elapsed < 20
    assert "Traceback" not in res.stderr
    assert f"store at {store_of(running)} is locked by another evalsi process (pid {running.proc.pid})" in res.stderr
    assert running.proc.poll() is None  # the running collector is untouched


def test_traces_list_on_a_held_store_reads_through_the_collector_holding_it(running: Collector, tmp_path: Path) -> None:
    """The config's API endpoint is not where the collector listens: the CLI finds the store held by a collector
    that recorded where its API answers, and reads through that API rather than fail on the lock."""
    cfg = serve_config(store_of(running))
    cfg["service"]["api"]["endpoint"] = f"127.0.0.1:{free_port()}"
    path = write(tmp_path, cfg)

    res = evalsi("traces", "list", "-c", str(path), cwd=tmp_path)

    assert res.returncode == 0, res.stderr
    assert "no traces yet" in res.stdout
    assert f"the collector at {running.api} serving the store" in res.stdout


# --- batch flow: a processor that acts on whole traces needs one that assembles them before it -------------------


def test_evaluate_without_trace_assembly_before_it_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nmetadata: {name: p}\n"
        "spec: {cascade: [{ref: builtin/latency, params: {max_ms: 8000}}]}\n"
    )
    doc = minimal()
    doc["processors"] = {"normalize": None, "tail_sampling": None, "evaluate": {"policies": [str(tmp_path / "p.yaml")]}}
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize", "evaluate"]
    doc["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    (error,) = errors_of(tmp_path, doc)
    assert error.startswith("service.pipelines.traces.processors.1: processor 'evaluate' acts on trace batches")
    assert "put tail_sampling before it" in error
    # after it is not before it
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize", "evaluate", "tail_sampling"]
    (error,) = errors_of(tmp_path, doc)
    assert "processors.1: processor 'evaluate'" in error
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    assert load_config(write(tmp_path, doc)).service.pipelines["traces"].processors[-1] == "evaluate"
