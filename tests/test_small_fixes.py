"""Small things a user meets at once: what `traces list` prints for a trace without tokens, `normalize` of a file that
is not there, `validate`'s nested policy errors, and a port clash at `serve`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from evalsi import cli
from evalsi.cli import traces
from evalsi.cli.source import Source
from evalsi.collector.config import parse_config
from evalsi.collector.service import Service, StartError

runner = CliRunner()


def trace_row(trace_id: str, tokens_in: int | None, tokens_out: int | None) -> dict[str, Any]:
    return {
        "trace_id": trace_id, "start_time_unix_nano": 1_700_000_000_000_000_000, "service_name": "checkout-agent",
        "root_name": "invoke_agent", "span_count": 3, "error_count": 0, "llm_calls": 1,
        "input_tokens": tokens_in, "output_tokens": tokens_out, "duration_ns": 2_000_000,
    }  # fmt: skip


def test_traces_list_prints_a_dash_for_a_trace_without_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [trace_row("a" * 32, 0, 0), trace_row("b" * 32, None, None), trace_row("c" * 32, 120, 35)]
    monkeypatch.setattr(traces, "open_source", lambda config, api, *a, **k: Source(None, "a test store"))  # type: ignore[arg-type]
    monkeypatch.setattr(traces, "read", lambda reader, fn, *a, **k: {"traces": rows})
    res = runner.invoke(cli.app, ["traces", "list"])
    assert res.exit_code == 0, res.output
    lines = {line.split()[0]: line for line in res.output.splitlines() if line.strip()}
    assert "0/0" not in res.output
    assert lines["a" * 32].split()[-3] == "-"
    assert lines["b" * 32].split()[-3] == "-"
    assert lines["c" * 32].split()[-3] == "120/35"


def test_normalize_of_a_missing_file_is_a_usage_error_that_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "capture.pb"
    res = runner.invoke(cli.app, ["normalize", str(missing)])
    assert res.exit_code == 2, res.output
    assert "no such file" in res.output and "capture.pb" in res.output
    assert "give the paths of OTLP files" in res.output
    assert "warning" not in res.output


def test_validate_indents_a_policy_files_errors_under_the_key_that_names_it(tmp_path: Path) -> None:
    policy = {
        "apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "broken"},
        "spec": {"bogus": 1, "cascade": [{"evaluator": "nope"}]},
    }  # fmt: skip
    config = {
        "receivers": {"otlp": {}},
        "processors": {"tail_sampling": {}, "evaluate": {"policies": ["policy.yaml"]}},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["tail_sampling", "evaluate"],
                    "exporters": ["clickhouse"],
                },
                "scores": {"exporters": ["clickhouse"]},
            }
        },
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    res = runner.invoke(cli.app, ["validate", "-c", str(tmp_path / "evalsi.yaml")])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.output.splitlines() if "policy.yaml:" in line]
    assert len(lines) == 3, res.output  # spec.cascade.0.ref, spec.cascade.0.evaluator, spec.bogus
    assert lines[0].startswith("  processors.evaluate: ")
    assert all(line.startswith("    policy.yaml: spec.") for line in lines[1:]), res.output


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_clash_names_the_config_key_and_leaves_nothing_behind(
    held_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the store's default place is ./.evalsi/store
    config = parse_config(
        {
            "receivers": {
                "otlp": {
                    "protocols": {
                        "grpc": {"endpoint": "127.0.0.1:0"},
                        "http": {"endpoint": f"127.0.0.1:{held_port}"},
                    }
                }
            },
            "exporters": {"clickhouse": {}},
            "service": {
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}},
                "api": {"endpoint": "127.0.0.1:0"},
                "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
                "workers": 1,
            },
        }
    )
    with pytest.raises(StartError) as raised:
        asyncio.run(Service(config).start())
    assert str(raised.value).startswith(f"receivers.otlp.protocols.http.endpoint: 127.0.0.1:{held_port} is in use;")
    assert not (tmp_path / ".evalsi").exists()


def test_serve_and_the_read_commands_indent_a_policy_files_errors_too(tmp_path: Path) -> None:
    policy = {"apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "broken"},
              "spec": {"bogus": 1, "cascade": [{"evaluator": "nope"}]}}  # fmt: skip
    config = {
        "receivers": {"otlp": {}},
        "processors": {"tail_sampling": {}, "evaluate": {"policies": ["policy.yaml"]}},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["tail_sampling", "evaluate"],
                    "exporters": ["clickhouse"],
                },
                "scores": {"exporters": ["clickhouse"]},
            }
        },
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    for command in (["serve"], ["traces", "list"], ["scores", "list"]):
        res = runner.invoke(cli.app, [*command, "-c", str(tmp_path / "evalsi.yaml")])
        assert res.exit_code == 1, res.output
        lines = [line for line in res.output.splitlines() if "policy.yaml:" in line]
        assert len(lines) == 3, res.output
        assert "processors.evaluate: " in lines[0]
        assert all(line.startswith("    policy.yaml: spec.") for line in lines[1:]), res.output
