"""Which collector the CLI talks to: `-c`, then `EVALSI_CONFIG`, then `./evalsi.yaml`, then the built-in default;
a read command that finds nothing names the collector (or store) it read and where that address came from. Proven
against two real `evalsi serve` processes: A holds a trace, B holds none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from running_collector import EVALSI, Collector, fixture_files, serve_config, start_collector


@pytest.fixture(scope="module")
def collectors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A (with one trace) and B (empty), each with a client config pointing at its bound API port."""
    started: list[Collector] = []
    try:
        found: dict[str, Any] = {}
        for name in ("a", "b"):
            root = tmp_path_factory.mktemp(f"collector-{name}")
            c = start_collector(root, serve_config(root / "store"))
            started.append(c)
            cfg = yaml.safe_load(c.config_path.read_text())
            cfg["service"]["api"]["endpoint"] = c.ready["api"]  # where it listens: port 0 was bound
            client = tmp_path_factory.mktemp(f"client-{name}") / "evalsi.yaml"
            client.write_text(yaml.safe_dump(cfg))
            found[name] = c
            found[f"{name}_config"] = client
        capture = fixture_files("otel-openai-v2", ".json")[0]
        r = httpx.post(found["a"].http + "/v1/traces", content=capture.read_bytes(),
                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status_code == 200, r.text
        assert found["a"].wait_stored(1) >= 1
        found["trace_id"] = json.loads(found["a"].cli("traces", "list", "--json").stdout)[0]["trace_id"]
        yield found
    finally:
        for c in started:
            c.stop()


def evalsi(*args: str, cwd: Path, config_env: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EVALSI_CONFIG", "EVALSI_API_KEY")}
    if config_env is not None:
        env["EVALSI_CONFIG"] = str(config_env)
    return subprocess.run([*EVALSI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def traces(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert res.returncode == 0, res.stderr
    return [t["trace_id"] for t in json.loads(res.stdout)]


SERVING = "serving the store"
STORE_KEY = "exporters.clickhouse"
"""A config whose embedded store an `evalsi serve` holds is read through that collector, found by the store the
config names (the serve's record beside it), and the message says so."""


def local(tmp_path: Path, config: Path) -> Path:
    """A working directory holding `./evalsi.yaml` = `config`."""
    (tmp_path / "evalsi.yaml").write_text(config.read_text())
    return tmp_path


def test_a_local_evalsi_yaml_is_read_without_c(collectors: dict[str, Any], tmp_path: Path) -> None:
    """The reported bug: in a directory holding evalsi.yaml, `evalsi scores list` went to the default port."""
    cwd = local(tmp_path, collectors["b_config"])
    res = evalsi("scores", "list", cwd=cwd)
    assert res.returncode == 0, res.stderr
    b = collectors["b"].api
    assert res.stdout.strip() == f"no scores yet in the collector at {b} {SERVING} (from ./evalsi.yaml: {STORE_KEY})"
    res = evalsi("traces", "list", cwd=cwd)
    assert res.stdout.strip() == f"no traces yet in the collector at {b} {SERVING} (from ./evalsi.yaml: {STORE_KEY})"
    # and with A's config there, A's trace is what is read
    assert traces(evalsi("traces", "list", "--json", cwd=local(tmp_path, collectors["a_config"]))) == [
        collectors["trace_id"]
    ]


def test_evalsi_config_beats_the_local_file(collectors: dict[str, Any], tmp_path: Path) -> None:
    cwd = local(tmp_path, collectors["b_config"])
    env_config = collectors["a_config"]
    assert traces(evalsi("traces", "list", "--json", cwd=cwd, config_env=env_config)) == [collectors["trace_id"]]
    # the other way round: the environment names B, the local file A
    cwd = local(tmp_path, collectors["a_config"])
    res = evalsi("traces", "list", cwd=cwd, config_env=collectors["b_config"])
    assert res.returncode == 0, res.stderr
    expected = f"no traces yet in the collector at {collectors['b'].api} {SERVING} (from EVALSI_CONFIG="
    assert res.stdout.startswith(expected + f"{collectors['b_config']}: {STORE_KEY})"), res.stdout


def test_c_beats_evalsi_config_and_the_local_file(collectors: dict[str, Any], tmp_path: Path) -> None:
    cwd = local(tmp_path, collectors["a_config"])
    b_config = str(collectors["b_config"])
    res = evalsi("traces", "list", "-c", b_config, cwd=cwd, config_env=collectors["a_config"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"no traces yet in the collector at {collectors['b'].api} {SERVING} (from -c {b_config}: {STORE_KEY})"
    )
    res = evalsi(
        "traces", "list", "--json", "-c", str(collectors["a_config"]), cwd=cwd, config_env=collectors["b_config"]
    )
    assert traces(res) == [collectors["trace_id"]]


def test_the_built_in_default_when_nothing_is_found(collectors: dict[str, Any], tmp_path: Path) -> None:
    res = evalsi("scores", "list", cwd=tmp_path)
    said = res.stdout + res.stderr
    # the default API (127.0.0.1:8080) answers or not on this machine: either way the output says it is the default
    assert "built-in default" in said, said
    assert collectors["a"].api not in said and collectors["b"].api not in said
    assert "Traceback" not in res.stderr


def test_api_beats_every_config(collectors: dict[str, Any], tmp_path: Path) -> None:
    cwd = local(tmp_path, collectors["a_config"])
    b = collectors["b"].api
    res = evalsi("traces", "list", "--api", b, "-c", str(collectors["a_config"]), cwd=cwd)
    assert res.stdout.strip() == f"no traces yet in the collector at {b} (from --api)"
    res = evalsi("scores", "list", "--api", b, "--policy", "p", cwd=cwd)
    assert res.stdout.strip() == f"no scores of policy p yet in the collector at {b} (from --api)"
    res = evalsi("policies", "stats", "--api", b, cwd=cwd)
    assert res.stdout.strip() == f"no scored scores in the last 5m in the collector at {b} (from --api)"
    assert traces(evalsi("traces", "list", "--json", "--api", collectors["a"].api, cwd=tmp_path)) == [
        collectors["trace_id"]
    ]


def test_a_missing_trace_names_the_collector_and_the_source(collectors: dict[str, Any], tmp_path: Path) -> None:
    cwd = local(tmp_path, collectors["b_config"])
    res = evalsi("traces", "show", collectors["trace_id"], cwd=cwd)
    assert res.returncode == 1
    assert (
        f"trace {collectors['trace_id']} not found in the collector at {collectors['b'].api} {SERVING} "
        f"(from ./evalsi.yaml: {STORE_KEY})"
    ) in " ".join(res.stderr.split())
    shown = evalsi("traces", "show", collectors["trace_id"], "--json", cwd=local(tmp_path, collectors["a_config"]))
    assert shown.returncode == 0 and json.loads(shown.stdout)["spans"], shown.stderr


def test_validate_finds_the_config_too(collectors: dict[str, Any], tmp_path: Path) -> None:
    res = evalsi("validate", cwd=local(tmp_path, collectors["b_config"]))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("OK: evalsi.yaml")
    res = evalsi("validate", cwd=tmp_path, config_env=collectors["a_config"])
    assert res.returncode == 0 and res.stdout.startswith(f"OK: {collectors['a_config']}"), res.stderr
    (tmp_path / "evalsi.yaml").unlink()
    res = evalsi("validate", cwd=tmp_path)
    assert res.returncode == 1 and "EVALSI_CONFIG" in res.stderr


def test_a_missing_evalsi_config_file_is_an_error_that_says_so(tmp_path: Path) -> None:
    res = evalsi("traces", "list", cwd=tmp_path, config_env=tmp_path / "nowhere.yaml")
    assert res.returncode == 1
    assert "cannot read" in res.stderr and "EVALSI_CONFIG=" in res.stderr and "Traceback" not in res.stderr


def test_importing_the_cli_loads_no_exporter_store_or_dataframe_library() -> None:
    heavy = ("polars", "prometheus_client", "chdb", "pyarrow", "mlflow")
    code = f"import evalsi.cli, sys; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    # the check can fail: the collector's own modules do load them
    code = code.replace("import evalsi.cli", "import evalsi.collector.service")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() != "[]"


def test_shell_completion_is_offered(tmp_path: Path) -> None:
    res = evalsi("--help", cwd=tmp_path)
    assert res.returncode == 0 and "--install-completion" in res.stdout and "--show-completion" in res.stdout
