"""Trajectories built from every capture with a tool loop, and `evalsi normalize` over files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from running_collector import FIXTURES

from evalsi.model.trajectory import build_trajectories
from evalsi.processors.normalize.files import normalize_files

TOOL_LOOP_FOLDERS = [
    "otel-openai-v2",
    "otel-openai-v2-latest",
    "openinference",
    "openllmetry-0.54",
    "openlit",
    "mlflow",
]
CANONICAL = {
    "trace_id", "span_id", "parent_span_id", "name", "kind", "service_name", "start_time_unix_nano", "duration_ns",
    "status_code", "status_message", "step_type", "model", "provider", "input_tokens", "output_tokens", "tool_name",
    "session_id", "input", "output", "content_captured", "convention", "attributes", "resource_attributes",
}  # fmt: skip


def _files(folder: str, scenario: str) -> list[Path]:
    files = [FIXTURES / folder / f"{scenario}.pb"]
    logs = FIXTURES / folder / f"{scenario}.logs.pb"
    return files + ([logs] if logs.exists() else [])


def _meta(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "meta.json").read_text())


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_tool_loop_trajectory(folder: str) -> None:
    result = normalize_files(_files(folder, "chat_tools"))
    assert not result.problems
    (trajectory,) = build_trajectories(result.spans)
    markers = _meta(folder)["scenarios"]["chat_tools"]["markers"]
    types = [s["type"] for s in trajectory["steps"]]
    # the capture: an agent span around chat -> tool -> chat
    assert types[0] == "agent"
    assert types[1:] == ["llm", "tool", "llm"]
    assert [s["depth"] for s in trajectory["steps"]] == [0, 1, 1, 1]
    agent_id = trajectory["steps"][0]["span_id"]
    assert all(s["parent_span_id"] == agent_id for s in trajectory["steps"][1:])
    # one tool call, get_weather(location=Paris), however the library records it
    assert [c["name"] for c in trajectory["tool_calls"]] == ["get_weather"]
    args = trajectory["tool_calls"][0]["arguments"]
    args_text = args if isinstance(args, str) else json.dumps(args)
    assert any(m in args_text for m in markers["tool_args"])
    tool = trajectory["steps"][2]
    assert tool["tool_name"] == "get_weather"
    assert markers["tool_result"] in json.dumps(tool["result"])
    assert trajectory["llm_calls"] == 2
    assert trajectory["input_tokens"] > 0 and trajectory["output_tokens"] > 0
    # steps are in time order within their parent
    starts = [s["start_time_unix_nano"] for s in trajectory["steps"][1:]]
    assert starts == sorted(starts)
    assert markers["completion"] in (trajectory["final_output"] or "")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_error_trajectory_counts_the_failed_call(folder: str) -> None:
    result = normalize_files(_files(folder, "chat_error"))
    (trajectory,) = build_trajectories(result.spans)
    failed = [s for s in trajectory["steps"] if s["error"]]
    assert failed and trajectory["errors"] == len(failed)
    assert all(s["type"] == "llm" for s in failed)


def test_normalize_cli_joins_logs_and_prints_canonical_json() -> None:
    files = _files("otel-openai-v2", "chat_tools")
    res = subprocess.run(
        [sys.executable, "-m", "evalsi", "normalize", *map(str, files), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc) == {"spans", "trajectories"}
    assert len(doc["spans"]) == 4 and len(doc["trajectories"]) == 1
    for span in doc["spans"]:
        assert CANONICAL <= set(span)
    chats = [s for s in doc["spans"] if s["step_type"] == "llm"]
    # content lives in the .logs.pb file for this library: normalize joined it
    assert len(chats) == 2 and all(s["content_captured"] for s in chats)
    markers = _meta("otel-openai-v2")["scenarios"]["chat_tools"]["markers"]
    assert any(markers["prompt"] in json.dumps(s["input"]) for s in chats)

    human = subprocess.run(
        [sys.executable, "-m", "evalsi", "normalize", *map(str, files)], capture_output=True, text=True, timeout=120
    )
    assert human.returncode == 0 and "get_weather" in human.stdout and "otel_genai" in human.stdout


def test_normalize_cli_reports_an_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = subprocess.run(
        [sys.executable, "-m", "evalsi", "normalize", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1
    assert "bad.json" in res.stderr and "not valid JSON" in res.stderr
    assert "Traceback" not in res.stderr
