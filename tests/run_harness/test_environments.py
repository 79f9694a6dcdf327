"""Harness environments end to end, as a user runs them with `evalsi run`: task folders with setup, check and
teardown scripts; multi-turn tasks with a scripted user; faults injected into tools; record and replay. Traces go to a
real collector over OTLP and are read back through its API."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from running_collector import Collector

from evalsi.model.span import span_from_canonical
from evalsi.model.trajectory import build_trajectory

from .test_run_e2e import evalsi, run_json

HERE = Path(__file__).parent


def tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run imports `tools` from this folder; whatever PYTHONPATH the tests run with stays (the code under test)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))


AGENT = '''
from pathlib import Path


def good(task, workdir):
    """Reads input.txt (written by the task's setup) and writes its upper case to out.txt."""
    text = (Path(workdir) / "input.txt").read_text()
    (Path(workdir) / "out.txt").write_text(text.upper())
    return "done"


def broken(task, workdir):
    (Path(workdir) / "out.txt").write_text("something else")
    return "done"
'''

CHECK = """
import json, os, pathlib
work = pathlib.Path(os.environ["EVALSI_WORKDIR"])
out = work / "out.txt"
ok = out.exists() and out.read_text() == "HELLO WORLD"
answer = pathlib.Path(os.environ["EVALSI_ANSWER_FILE"]).read_text()
print("checking...")
print(json.dumps({"passed": ok, "score": 1.0 if ok else 0.0, "details": {"answer": answer, "home": os.environ["HOME"],
                  "secret": os.environ.get("EVALSI_TEST_SECRET")}}))
"""


def write_run(tmp: Path, spec: dict[str, Any], name: str = "env") -> Path:
    doc = {"apiVersion": "evals.si/v1alpha1", "kind": "EvalRun", "metadata": {"name": name},
           "spec": {"trials": 1, "concurrency": 2, "timeout": "60s", **spec}}  # fmt: skip
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


def task_folder(root: Path, name: str, *, check: str = CHECK, teardown: bool = True) -> Path:
    folder = root / name
    (folder / "files").mkdir(parents=True)
    (folder / "task.yaml").write_text(yaml.safe_dump({"instruction": "Upper-case input.txt into out.txt"}))
    (folder / "files" / "README").write_text("a fixture file")
    (folder / "setup.sh").write_text('printf "hello world" > input.txt\ntest -f README\n')
    (folder / "check.py").write_text(check)
    if teardown:
        (folder / "teardown.sh").write_text('echo "$EVALSI_TASK_ID" >> "$EVALSI_TEARDOWN_LOG"\n')
    return folder


def scores_of(collector: Collector, run_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{collector.api}/api/v1/runs/{run_id}/scores").json()["scores"]


def spans_of(collector: Collector, trace_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{collector.api}/api/v1/traces/{trace_id}").json()["spans"]


def test_a_task_folders_checker_passes_a_correct_agent_and_fails_a_broken_one(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    task_folder(tmp_path / "tasks", "upper")
    log = tmp_path / "teardown.log"
    monkeypatch.setenv("EVALSI_TEARDOWN_LOG", str(log))
    monkeypatch.setenv("EVALSI_TEST_SECRET", "do-not-leak")
    env = {"trust": "local", "pass_env": ["EVALSI_TEARDOWN_LOG"]}
    for function, passed in (("agent:good", True), ("agent:broken", False)):
        path = write_run(tmp_path, {"target": {"python": {"function": function}}, "dataset": "tasks",
                                    "environment": env})  # fmt: skip
        res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path)
        run = run_json(res)
        assert run["infra_errors"] == [], run["infra_errors"]
        assert run["metrics"]["task-success"]["mean"] == (1.0 if passed else 0.0)
        [score] = scores_of(collector, run["run_id"])
        assert (score["name"], score["passed"], score["source"]) == ("task-success", passed, "checker")
        details = json.loads(score["explanation"])
        # the checker saw the agent's answer, ran in the attempt's own home, and not with the scrubbed variable
        assert details["answer"] == "done" and details["secret"] is None
        assert details["home"] != str(Path.home())
        assert not Path(details["home"]).exists()  # the working directory is gone afterwards
    assert log.read_text().split() == ["upper", "upper"]  # teardown ran after each attempt


def test_a_checker_that_crashes_or_times_out_is_an_infrastructure_error(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    task_folder(tmp_path / "tasks", "crashes", check="raise SystemExit('checker bug')\n", teardown=False)
    task_folder(tmp_path / "tasks", "hangs", check="import time\ntime.sleep(30)\n", teardown=False)
    task_folder(tmp_path / "tasks", "mute", check="print('no verdict here')\n", teardown=False)
    path = write_run(tmp_path, {"target": {"python": {"function": "agent:good"}}, "dataset": "tasks",
                                "environment": {"trust": "local", "check_timeout": "1s"}})  # fmt: skip
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    errors = {e["task_id"]: e for e in run["infra_errors"]}
    assert {e["kind"] for e in errors.values()} == {"checker"}
    assert "exited with 1: checker bug" in errors["crashes"]["message"]
    assert "did not finish in 1s" in errors["hangs"]["message"]
    assert "no JSON verdict" in errors["mute"]["message"]
    assert "task-success" not in run["metrics"]  # none of them counts as a failed task


def test_task_scripts_run_only_when_the_spec_trusts_them(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    task_folder(tmp_path / "tasks", "upper")
    path = write_run(tmp_path, {"target": {"python": {"function": "agent:good"}}, "dataset": "tasks"})
    res = evalsi("run", "-f", str(path), "--json", cwd=tmp_path)
    assert res.returncode == 2
    assert "spec.environment.trust" in res.stderr and "trust: local" in res.stderr
    # `evalsi validate` says so too, with the run file's name, and that nothing scores the run without a checker
    (tmp_path / "tasks" / "upper" / "check.py").unlink()
    res = evalsi("validate", "-f", str(path), cwd=tmp_path)
    assert res.returncode == 1
    assert f"{path}: spec.environment.trust" in res.stderr and "spec.evaluators: nothing scores this run" in res.stderr


def test_a_multi_turn_task_with_a_scripted_user_is_one_trace_of_turns(tmp_path: Path, collector: Collector) -> None:
    data = [
        {"id": "talk", "input": "What is 1 + 1?", "reference": "5",
         "metadata": {"user": {"turns": ["What is 2 + 3?", "Thanks! ###STOP###", "never said"]}}},
        {"id": "long", "input": "What is 2 + 2?", "metadata": {"user": {"turns": [f"What is {i} + 1?"
                                                                                for i in range(10)]}}},
    ]  # fmt: skip
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    path = write_run(tmp_path, {"target": {"openai": {"base_url": "stub", "model": "stub"}}, "dataset": "data.jsonl",
                                "user": {"max_turns": 3}, "evaluators": [{"ref": "builtin/exact-match"}]})  # fmt: skip
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    assert run["infra_errors"] == []
    scores = {s["task_id"]: s for s in scores_of(collector, run["run_id"])}
    spans = sorted(spans_of(collector, scores["talk"]["trace_id"]), key=lambda s: s["start_time_unix_nano"])
    turns = [(s["step_type"], (s["output"] or [{}])[-1].get("parts", [{}])[0].get("content"))
             for s in spans if s["step_type"] in ("user", "llm")]  # fmt: skip
    assert turns == [
        ("user", "What is 1 + 1?"), ("llm", "2"), ("user", "What is 2 + 3?"), ("llm", "5"),
        ("user", "Thanks! ###STOP###"),
    ]  # fmt: skip
    assert scores["talk"]["passed"] is True  # the conversation's answer is the agent's last reply
    long = spans_of(collector, scores["long"]["trace_id"])
    assert sum(s["step_type"] == "llm" for s in long) == 3  # max_turns: three agent replies, then it ends
    trajectory = build_trajectory([span_from_canonical(s) for s in spans])
    assert [s["type"] for s in trajectory["steps"]][:3] == ["agent", "user", "llm"]
    assert trajectory["final_output"] == "5" and trajectory["llm_calls"] == 2


def test_a_task_without_input_is_opened_by_the_user(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "users.py").write_text(
        "def user(task, messages):\n"
        "    said = [m for m in messages if m['role'] == 'user']\n"
        "    return 'What is 3 + 4?' if not said else None\n"
    )
    data = [{"id": "opened", "metadata": {"user": {"instruction": "ask a sum"}}, "reference": "7"}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    spec = {"target": {"openai": {"base_url": "stub", "model": "stub"}}, "dataset": "data.jsonl",
            "user": {"python": "users:user"}, "evaluators": [{"ref": "builtin/exact-match"}]}  # fmt: skip
    path = write_run(tmp_path, spec)
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    assert run["infra_errors"] == [] and run["metrics"]["exact-match"]["mean"] == 1.0


def weather_run(tmp: Path, model: str, faults: list[dict[str, Any]], n: int = 20, **extra: Any) -> Path:
    data = [{"id": f"w{i}", "input": "What is the weather in Paris?"} for i in range(n)]
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    target = {"openai": {"base_url": "stub", "model": model, "tools": ["tools:get_weather"]}}
    return write_run(tmp, {
        "target": target, "dataset": "data.jsonl", "faults": faults, "seed": 7, "concurrency": 4,
        "evaluators": [{"ref": "builtin/tool-call-error-rate"}, {"ref": "builtin/tool-error-recovery"}], **extra,
    })  # fmt: skip


def test_faults_at_half_the_calls_show_in_the_error_rate_and_recovery_tells_retrying_from_giving_up(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools_on_path(monkeypatch)
    faults = [{"tool": "get_weather", "kind": "error", "rate": 0.5, "message": "weather service down"}]
    gives_up = run_json(evalsi("run", "-f", str(weather_run(tmp_path, "stub", faults)), "--collector",
                               collector.api, "--json", cwd=tmp_path))  # fmt: skip
    failed = gives_up["faults"]["error"]
    assert 4 <= failed <= 16  # 20 calls at 50%: seeded, so the same every run
    # one call per attempt: the mean is the share of calls that failed (as online), the pass rate those that did not
    assert gives_up["metrics"]["tool-call-error-rate"]["mean"] == pytest.approx(failed / 20)
    assert gives_up["metrics"]["tool-call-error-rate"]["pass_rate"] == pytest.approx(1 - failed / 20)
    assert gives_up["metrics"]["tool-error-recovery"]["mean"] == 0.0  # it gave up on every failure
    again = run_json(evalsi("run", "-f", str(weather_run(tmp_path, "stub", faults)), "--collector", collector.api,
                            "--json", cwd=tmp_path))  # fmt: skip
    assert again["faults"] == gives_up["faults"]
    retries = run_json(evalsi("run", "-f", str(weather_run(tmp_path, "stub-retry-tools", faults)), "--collector",
                              collector.api, "--json", cwd=tmp_path))  # fmt: skip
    recovery = retries["metrics"]["tool-error-recovery"]
    assert recovery["mean"] > 0.5 and recovery["n"] >= 4
    # a fault is a span event on its tool span
    scores = scores_of(collector, gives_up["run_id"])
    failing = next(s for s in scores if s["name"] == "tool-call-error-rate" and s["value"] == 1.0)
    assert failing["passed"] is False
    [tool] = [s for s in spans_of(collector, failing["trace_id"]) if s["step_type"] == "tool"]
    assert any(e["name"] == "evalsi.fault" and e["attributes"]["evalsi.fault.kind"] == "error" for e in tool["events"])
    assert tool["status_message"] == "weather service down"


def test_record_then_replay_without_network_gives_the_same_outputs_and_scores(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools_on_path(monkeypatch)
    cassette = tmp_path / "cassette"
    path = weather_run(tmp_path, "stub", [{"tool": "*", "kind": "error", "calls": [1]}], n=3, trials=2,
                       evaluators=[{"ref": "builtin/tool-call-error-rate", "params": {"max_rate": 1.0}},
                                   {"ref": "builtin/length"}])  # fmt: skip
    recorded = run_json(evalsi("run", "-f", str(path), "--record", str(cassette), "--collector", collector.api,
                               "--json", cwd=tmp_path))  # fmt: skip
    assert len(list(cassette.rglob("trial-*.json"))) == 6
    # the replay's model is an address nothing listens on: every call must come from the cassette
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["target"]["openai"]["base_url"] = "http://127.0.0.1:9/v1"
    path.write_text(yaml.safe_dump(doc))
    replayed = run_json(evalsi("run", "-f", str(path), "--replay", str(cassette), "--collector", collector.api,
                               "--json", cwd=tmp_path))  # fmt: skip
    assert replayed["infra_errors"] == []

    def by_key(run: dict[str, Any]) -> dict[tuple[str, int, str], tuple[Any, Any]]:
        return {(s["task_id"], s["trial"], s["name"]): (s["value"], s["passed"])
                for s in scores_of(collector, run["run_id"])}  # fmt: skip

    assert by_key(replayed) == by_key(recorded) and len(by_key(recorded)) == 12
    outputs = {}
    for run in (recorded, replayed):
        for s in scores_of(collector, run["run_id"]):
            root = next(x for x in spans_of(collector, s["trace_id"]) if not x["parent_span_id"])
            outputs.setdefault(run["run_id"], {})[(s["task_id"], s["trial"])] = root["output"]
    assert outputs[recorded["run_id"]] == outputs[replayed["run_id"]]
    # a changed request is a miss naming it
    doc["spec"]["target"]["openai"]["system"] = "Be brief."
    path.write_text(yaml.safe_dump(doc))
    missed = run_json(evalsi("run", "-f", str(path), "--replay", str(cassette), "--collector", collector.api,
                             "--json", cwd=tmp_path))  # fmt: skip
    assert len(missed["infra_errors"]) == 6 and {e["kind"] for e in missed["infra_errors"]} == {"cassette_miss"}
    message = missed["infra_errors"][0]["message"]
    assert "request not recorded" in message and "Be brief." in message
    # branching at step 1: the first model call from the cassette (whatever the request), the rest live
    doc["spec"]["target"]["openai"]["base_url"] = "stub"
    path.write_text(yaml.safe_dump(doc))
    branched = run_json(evalsi("run", "-f", str(path), "--replay", str(cassette), "--from-step", "1",
                               "--collector", collector.api, "--json", cwd=tmp_path))  # fmt: skip
    assert branched["infra_errors"] == [] and branched["attempts"] == 6


def test_replay_flags_are_checked_before_anything_runs(tmp_path: Path) -> None:
    path = weather_run(tmp_path, "stub", [], n=1)
    res = evalsi("run", "-f", str(path), "--replay", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert res.returncode == 2 and "no such cassette directory" in res.stderr
    res = evalsi("run", "-f", str(path), "--from-step", "2", cwd=tmp_path)
    assert res.returncode == 2 and "--from-step needs --replay" in res.stderr


def test_a_target_that_cannot_converse_is_refused_before_the_run(tmp_path: Path) -> None:
    data = [{"id": "t", "input": "hi", "metadata": {"user": {"turns": ["more"]}}}]
    (tmp_path / "data.jsonl").write_text(json.dumps(data[0]) + "\n")
    path = write_run(tmp_path, {"target": {"command": {"argv": [sys.executable, "-c", "print(1)"]}},
                                "dataset": "data.jsonl", "evaluators": [{"ref": "builtin/length"}]})  # fmt: skip
    res = evalsi("run", "-f", str(path), cwd=tmp_path)
    assert res.returncode == 2 and "cannot hold one" in res.stderr


def test_an_mcp_servers_tools_serve_the_built_in_agent_and_their_calls_are_tool_spans(
    tmp_path: Path, collector: Collector
) -> None:
    (tmp_path / "data.jsonl").write_text(json.dumps({"id": "paris", "input": "What is the weather in Paris?"}) + "\n")
    server = HERE / "mcp_server_for_tests.py"
    target = {"openai": {"base_url": "stub", "model": "stub",
                         "mcp": [{"name": "weather", "command": ["python", str(server)]}]}}  # fmt: skip
    path = write_run(tmp_path, {"target": target, "dataset": "data.jsonl",
                                "evaluators": [{"ref": "builtin/tool-call-error-rate"}]})  # fmt: skip
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    assert run["infra_errors"] == [] and run["metrics"]["tool-call-error-rate"]["mean"] == 0.0  # no call failed
    [score] = scores_of(collector, run["run_id"])
    spans = spans_of(collector, score["trace_id"])
    [tool] = [s for s in spans if s["step_type"] == "tool"]
    assert tool["tool_name"] == "get_weather"
    assert tool["attributes"]["gen_ai.tool.call.arguments"] == '{"city":"Paris"}'
    assert "sunny" in tool["attributes"]["gen_ai.tool.call.result"]
    [root] = [s for s in spans if not s["parent_span_id"]]
    assert "sunny" in root["output"][0]["parts"][0]["content"]


def test_the_built_in_agents_tools_find_the_attempts_working_directory(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "weather_tools.py").write_text(
        "from evalsi.run_harness.environment import workdir\n\n\n"
        "def get_weather(city: str) -> str:\n"
        '    """Get the weather in a city."""\n'
        '    (workdir() / "asked.txt").write_text(city)\n'
        '    return "sunny"\n'
    )
    folder = tmp_path / "tasks" / "weather"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(yaml.safe_dump({"instruction": "What is the weather in Paris?"}))
    (folder / "check.sh").write_text(
        'if [ "$(cat asked.txt)" = "Paris" ]; then echo \'{"passed": true}\'; else echo \'{"passed": false}\'; fi\n'
    )
    target = {"openai": {"base_url": "stub", "model": "stub", "tools": ["weather_tools:get_weather"]}}
    path = write_run(tmp_path, {"target": target, "dataset": "tasks", "environment": {"trust": "local"}})
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    assert run["infra_errors"] == [] and run["metrics"]["task-success"]["mean"] == 1.0
