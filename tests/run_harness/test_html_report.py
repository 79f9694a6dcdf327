"""The HTML and Markdown run reports: their content, the escaping of untrusted values, no network references; and
the HTML page in headless Chromium as a person looks at it: the task x trial grid above the fold with one coloured
cell per attempt, expected beside actual output, the filter hiding rows, a cell opening its attempt (read back from
the rendered DOM), and a screenshot that is not blank (the PNG read with the standard library)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evalsi.run_harness.html import MAX_EXAMPLES, MAX_TEXT, SCRIPT as PAGE_SCRIPT, html_report
from evalsi.run_harness.report import markdown, metric_rows

SCRIPT = "<script>alert(1)</script>"
FAILING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
LONG = "x" * (MAX_TEXT + 1234)


def _run() -> dict[str, Any]:
    return {
        "run_id": "nightly-20250101-000000-abc123",
        "name": "nightly",
        "manifest": {
            "run_id": "nightly-20250101-000000-abc123",
            "name": "nightly",
            "labels": {"team": "search"},
            "evalsi_version": "0.1.0",
            "spec_hash": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "dataset": {"path": "data/qa.jsonl", "hash": "9f86d081884c7d659a2feaa0c55ad015", "tasks": 3},
            "target": "http:http://localhost:8080/agent",
            "trials": 2,
            "evaluators": [{"ref": "exact_match", "version": "1"}, {"ref": "similarity", "version": "2"}],
            "judge": {"model": "judge-model-7", "endpoint": "https://judge.example/v1"},
            "seed": 42,
            "started_unix_nano": 1_735_689_600_000_000_000,
        },
        "metrics": {
            "correct": {
                "name": "correct",
                "kind": "pass_fail",
                "n": 5,
                "mean": 0.6,
                "low": 0.2307,
                "high": 0.8824,
                "confidence": 0.95,
                "interval": "wilson",
                "seed": None,
                "resamples": None,
                "p50": None,
                "p95": None,
                "variance_across_trials": 0.125,
                "pass_at_k": {"1": 0.6, "2": 0.6667},
                "pass_hat_k": {"1": 0.6, "2": 0.3333},
                "errors": 1,
                "skipped": 0,
                "no_value": 0,
            },
            "similarity": {
                "name": "similarity",
                "kind": "numeric",
                "n": 6,
                "mean": 0.71234,
                "low": 0.5512,
                "high": 0.8619,
                "confidence": 0.95,
                "interval": "bootstrap_percentile",
                "seed": 42,
                "resamples": 10000,
                "p50": 0.7345,
                "p95": 0.9512,
                "variance_across_trials": 0.01,
                "pass_at_k": {},
                "pass_hat_k": {},
                "errors": 0,
                "skipped": 2,
                "no_value": 0,
            },
        },
        "gates": [
            {"gate": "correct.mean >= 0.9", "passed": False, "detail": ""},
            {"gate": "similarity.p50 >= 0.5", "passed": True, "detail": ""},
        ],
        "passed": False,
        "infra_errors": [
            {
                "task_id": "t3",
                "trial": 1,
                "kind": "timeout",
                "message": "no answer in 30s",
                "trace_id": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
            },
        ],
        "attempts": 6,
        "skipped_resumed": 0,
        "not_run": 0,
        "comparison": {
            "correct": {
                "n": 5,
                "test": "mcnemar",
                "regressions": 2,
                "fixes": 0,
                "delta": -0.4,
                "low": -0.8,
                "high": 0.0,
                "pValue": 0.5,
                "regressed": False,
                "improved": False,
            },
            "similarity": {
                "n": 6,
                "test": "paired_bootstrap",
                "delta": -0.1523,
                "low": -0.25,
                "high": -0.05,
                "pValue": 0.004,
                "regressed": True,
                "improved": False,
            },
        },
        "wall_s": 12.345,
        "agent_s": 40.5,
    }


def _scores() -> list[dict[str, Any]]:
    def score(task: str, trial: int, name: str, **kw: Any) -> dict[str, Any]:
        base = {
            "trace_id": f"{task}{trial}".ljust(32, "0"),
            "task_id": task,
            "trial": trial,
            "name": name,
            "value": None,
            "passed": None,
            "outcome": "scored",
            "reason": None,
            "explanation": None,
            "evaluator": name,
        }
        return {**base, **kw}

    return [
        score("t1", 0, "correct", value=1.0, passed=True),
        score("t1", 0, "similarity", value=0.9),
        score(
            "t2",
            0,
            "correct",
            trace_id=FAILING_TRACE,
            value=0.0,
            passed=False,
            reason="mismatch",
            explanation=f"expected 42, the agent answered {SCRIPT}",
        ),
        score("t2", 0, "similarity", trace_id=FAILING_TRACE, value=0.12),
        score("t2", 1, "correct", outcome="error", reason="judge_timeout", explanation="the judge did not answer"),
    ]


def _trajectories() -> dict[str, dict[str, Any]]:
    steps = [
        {
            "type": "agent",
            "span_id": "a",
            "parent_span_id": None,
            "depth": 0,
            "name": "invoke_agent qa",
            "duration_ns": 2_500_000_000,
            "error": False,
            "error_type": None,
            "status_message": None,
            "agent_name": "qa",
            "input": [{"role": "user", "parts": [{"type": "text", "content": "What is 6*7?"}]}],
            "output": [{"role": "assistant", "parts": [{"type": "text", "content": SCRIPT}]}],
        },
        {
            "type": "llm",
            "span_id": "b",
            "parent_span_id": "a",
            "depth": 1,
            "name": "chat stub-model",
            "duration_ns": 800_000_000,
            "error": False,
            "error_type": None,
            "status_message": None,
            "model": "stub-model",
            "input_tokens": 12,
            "output_tokens": 7,
            "cost_usd": None,
            "input": [{"role": "user", "parts": [{"type": "text", "content": "What is 6*7?"}]}],
            "output": [
                {
                    "role": "assistant",
                    "parts": [
                        {"type": "text", "content": "Let me compute. " + LONG},
                        {"type": "tool_call", "id": "call_1", "name": "calculator", "arguments": {"expression": "6*7"}},
                    ],
                }
            ],
            "tool_calls": [{"id": "call_1", "name": "calculator", "arguments": {"expression": "6*7"}}],
        },
        {
            "type": "tool",
            "span_id": "c",
            "parent_span_id": "a",
            "depth": 1,
            "name": "execute_tool calculator",
            "duration_ns": 1_000_000,
            "error": True,
            "error_type": "ZeroDivisionError",
            "status_message": "division by zero",
            "tool_name": "calculator",
            "call_id": "call_1",
            "arguments": {"expression": "6*7"},
            "result": "Traceback: ZeroDivisionError",
        },
        {
            "type": "llm",
            "span_id": "d",
            "parent_span_id": "a",
            "depth": 1,
            "name": "chat stub-model",
            "duration_ns": 600_000_000,
            "error": False,
            "error_type": None,
            "status_message": None,
            "model": "stub-model",
            "input_tokens": 30,
            "output_tokens": 9,
            "cost_usd": None,
            "input": [],
            "output": [{"role": "assistant", "parts": [{"type": "text", "content": SCRIPT}]}],
            "tool_calls": [],
        },
    ]
    return {
        FAILING_TRACE: {
            "trace_id": FAILING_TRACE,
            "session_id": None,
            "start_time_unix_nano": 1,
            "steps": steps,
            "tool_calls": [{"name": "calculator", "id": "call_1", "arguments": {"expression": "6*7"}, "error": True}],
            "llm_calls": 2,
            "input_tokens": 42,
            "output_tokens": 16,
            "errors": 1,
            "final_output": SCRIPT,
        }
    }


@pytest.fixture(scope="module")
def page() -> str:
    return html_report(_run(), _scores(), _trajectories())


def test_metrics_appear_as_in_the_table(page: str) -> None:
    for row in metric_rows(_run()):
        for cell in row:
            assert html.escape(cell) in page, cell
    for figure in (
        "0.600",
        "[0.231, 0.882]",
        "1:0.60 2:0.67",
        "1:0.60 2:0.33",
        "0.712",
        "[0.551, 0.862]",
        "0.735",
        "0.951",
    ):
        assert figure in page
    assert page.count("<svg") == 1  # the whisker of the one pass/fail metric


def test_header_manifest_gates_comparison_and_infra_errors(page: str) -> None:
    assert "nightly-20250101-000000-abc123" in page
    assert "FAIL: 1 of 2 gates failed" in page
    assert "2025-01-01 00:00:00 UTC" in page
    assert "12.3 s" in page and "40.5 s" in page
    for text in (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "data/qa.jsonl",
        "9f86d081884c7d659a2feaa0c55ad015",
        "judge-model-7",
        "exact_match",
        "similarity",
    ):
        assert text in page
    gates = re.findall(r'<span class="badge (pass|fail)">(PASS|FAIL)</span></td><td><code>([^<]*)</code>', page)
    assert [(m, g) for _, m, g in gates] == [("FAIL", "correct.mean &gt;= 0.9"), ("PASS", "similarity.p50 &gt;= 0.5")]
    assert "-0.152" in page and "[-0.250, -0.050]" in page and "0.004" in page
    assert '<span class="badge regressed">regressed</span>' in page
    assert "Infrastructure errors (1)" in page and "no answer in 30s" in page and "timeout" in page


def test_failing_examples_with_trajectory(page: str) -> None:
    assert "Attempts (3 scored, 2 failed or errored)" in page
    assert f"evalsi traces show {FAILING_TRACE}" in page
    assert "mismatch" in page and "judge_timeout" in page
    # the trajectory: tool call with its arguments, the tool's error, the long output cut with a visible marker
    assert "calculator" in page and "&quot;expression&quot;: &quot;6*7&quot;" in page
    assert "ZeroDivisionError: division by zero" in page
    assert "… (1,250 more characters)" in page  # "Let me compute. " is 16 characters more
    assert LONG not in page
    # the passing trace t1 is shown too, folded
    passing = re.search(r'<details class="attempt pass" id="a0-0"( open)?', page)
    assert passing is not None and passing.group(1) is None
    assert "t10".ljust(32, "0") in page


def test_untrusted_values_are_escaped(page: str) -> None:
    assert html.escape(SCRIPT) in page
    # the one script is the page's own filter and sort
    assert page.lower().count("<script") == 1 and f"<script>{PAGE_SCRIPT}</script>" in page


def test_no_network_references(page: str) -> None:
    tags = re.findall(r"<[a-zA-Z][^>]*>", page)
    assert tags
    for tag in tags:
        for name, value in re.findall(r"""([\w:-]+)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", tag):
            if name.lower() == "href":  # links within the page only: a grid cell to its attempt
                assert value.startswith('"#'), tag
                continue
            assert name.lower() not in ("src", "srcset", "action", "xlink:href", "poster"), tag
            assert not re.search(r"(?i)https?:|//|url\(", value), tag
    for tag in ("<link", "<img", "<iframe", "<object", "<embed", "<base", "<meta http-equiv"):
        assert tag not in page.lower()
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None and "url(" not in style.group(1) and "@import" not in style.group(1)
    # URLs in the data are there, as text
    assert "http:http://localhost:8080/agent" in page and "https://judge.example/v1" in page


def test_attempts_shown_in_detail_are_capped() -> None:
    def score(i: int, passed: bool) -> dict[str, Any]:
        return {"trace_id": f"{i:032x}", "task_id": f"task-{i:04d}", "trial": 0, "name": "correct",
                "value": float(passed), "passed": passed, "outcome": "scored", "reason": None, "explanation": None,
                "evaluator": "exact_match"}  # fmt: skip

    scores = [score(i, True) for i in range(20)] + [score(i, False) for i in range(20, 20 + MAX_EXAMPLES + 17)]
    page = html_report(_run(), scores, {})
    assert "37 more are left out" in page
    assert page.count("evalsi traces show ") == MAX_EXAMPLES  # failed ones first: no passed one is shown
    # every attempt is in the grid (t3's infrastructure error first), those not shown in detail without a link
    assert 'title="task-0000 · trial 0: pass"><span>✓</span>' in page and 'href="#a1-0"' not in page
    assert page.count('<td class="cell pass"') == 20 and page.count('<td class="cell fail"') == MAX_EXAMPLES + 17
    assert page.count('<td class="cell infra"') == 1
    assert page.count('<td class="cell none" title="not run">') == 20 + MAX_EXAMPLES + 17 + 1  # 2 trials each
    assert "trajectory not loaded" in page


def test_minimal_run() -> None:
    run = {
        "run_id": "r",
        "name": "n",
        "manifest": {},
        "metrics": {},
        "gates": [],
        "passed": True,
        "infra_errors": [],
        "attempts": 0,
        "skipped_resumed": 0,
        "not_run": 0,
        "comparison": None,
        "wall_s": 0.0,
        "agent_s": 0.0,
    }
    page = html_report(run, [])
    assert "no gates" in page and "No attempt was scored." in page and 'id="grid"' not in page


# --- a run of 4 tasks x 3 trials with failures: the grid, expected against actual, grouping ---------------------

GRID_TASKS = {
    "fr": {"input": "What is the capital of France?", "reference": {"expected_output": "Paris"}},
    "es": {"input": "What is the capital of Spain?", "reference": {"expected_output": "Madrid"}},
    "it": {"input": "Capital of Italy? " + SCRIPT, "reference": {"expected_output": "The capital of Italy is Rome."}},
    "de": {"input": "What is the capital of Germany?", "reference": {"expected_output": "Berlin"}},
}
ANSWERS = {"fr": ["Paris"] * 3, "es": ["Madrid", "Barcelona", "Madrid"], "it": ["The capital of Italy is Milan."] * 3,
           "de": ["Berlin", "Berlin, the capital of Germany", None]}  # fmt: skip
GRID = {"fr": ["pass", "pass", "pass"], "es": ["pass", "fail", "pass"], "it": ["fail", "fail", "fail"],
        "de": ["pass", "error", "infra"]}  # fmt: skip
"""The outcome of each task's trials: de's trial 1 is an evaluator error, its trial 2 an infrastructure error."""


def _trace(task: str, trial: int) -> str:
    return f"{task}{trial}".ljust(32, "f")


def _grid_run() -> dict[str, Any]:
    run = _run()
    run["manifest"] = {**run["manifest"], "trials": 3, "dataset": {"path": "caps.jsonl", "hash": "ab", "tasks": 4}}
    run["comparison"] = None
    run["infra_errors"] = [{"task_id": "de", "trial": 2, "kind": "timeout", "message": "no answer in 30s",
                            "trace_id": _trace("de", 2)}]  # fmt: skip
    return run


def _grid_scores() -> list[dict[str, Any]]:
    scores = []
    for task, outcomes in GRID.items():
        for trial, outcome in enumerate(outcomes):
            if outcome == "infra":
                continue
            base = {"trace_id": _trace(task, trial), "task_id": task, "trial": trial, "reason": None}
            answer, want = ANSWERS[task][trial], GRID_TASKS[task]["reference"]["expected_output"]
            match = {"name": "exact-match", "evaluator": "builtin/exact-match", "outcome": "scored",
                     "passed": outcome == "pass", "value": None,
                     "explanation": "output equals the expected output" if outcome == "pass" else
                     f"output differs from the expected output (lengths {len(answer)} and {len(want)})"}  # fmt: skip
            if outcome == "error":
                match = {**match, "outcome": "error", "passed": None, "reason": "judge_timeout",
                         "explanation": "the judge did not answer"}  # fmt: skip
            length = {"name": "length", "evaluator": "builtin/length", "outcome": "scored", "passed": None,
                      "value": float(len(answer)), "explanation": f"{len(answer)} chars"}  # fmt: skip
            scores += [{**base, **match}, {**base, **length}]
    return scores


def _grid_trajectories() -> dict[str, dict[str, Any]]:
    """One agent step and one LLM call per attempt; ids and timings differ between trials, what was done does not."""
    out = {}
    for task, answers in ANSWERS.items():
        for trial, answer in enumerate(answers):
            if answer is None:
                continue
            said = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
            asked = [{"role": "user", "parts": [{"type": "text", "content": GRID_TASKS[task]["input"]}]}]
            steps = [
                {"type": "agent", "span_id": f"{trial}a", "parent_span_id": None, "depth": 0, "name": "invoke_agent",
                 "start_time_unix_nano": 1000 + trial, "duration_ns": 5_000_000 * (trial + 1), "error": False,
                 "error_type": None, "status_message": None, "agent_name": "caps", "input": asked, "output": said},
                {"type": "llm", "span_id": f"{trial}b", "parent_span_id": f"{trial}a", "depth": 1, "name": "chat m1",
                 "start_time_unix_nano": 2000 + trial, "duration_ns": 3_000_000 * (trial + 1), "error": False,
                 "error_type": None, "status_message": None, "model": "m1", "input_tokens": 12, "output_tokens": 3,
                 "cost_usd": None, "input": asked, "output": said, "tool_calls": []},
            ]  # fmt: skip
            out[_trace(task, trial)] = {
                "trace_id": _trace(task, trial), "session_id": None, "start_time_unix_nano": 1000 + trial,
                "steps": steps, "tool_calls": [], "llm_calls": 1, "input_tokens": 12, "output_tokens": 3, "errors": 0,
                "final_output": answer,
            }  # fmt: skip
    return out


@pytest.fixture(scope="module")
def grid_page() -> str:
    return html_report(_grid_run(), _grid_scores(), _grid_trajectories(), GRID_TASKS)


def test_the_grid_has_one_cell_per_task_and_trial(grid_page: str) -> None:
    grid = re.search(r'<table class="grid" id="grid">(.*?)</table>', grid_page, re.S)
    assert grid is not None, "no task x trial grid"
    rows = re.findall(r'<tr data-task="([^"]*)".*?</tr>', grid.group(1), re.S)
    assert rows == ["fr", "es", "it", "de"]  # the dataset's order
    for task, outcomes in GRID.items():
        row = re.search(rf'<tr data-task="{task}".*?</tr>', grid.group(1), re.S)
        assert row is not None
        cells = re.findall(r'<td class="cell (\w+)"', row.group(0))
        assert cells == outcomes, task
    # a cell links to its attempt, and says why it failed
    assert '<td class="cell fail" data-outcome="fail"' in grid_page and 'href="#a1-1"' in grid_page
    assert 'id="a1-1"' in grid_page
    assert "es · trial 1: fail (exact-match: output differs from the expected output" in grid_page


def test_expected_beside_actual_with_the_difference_marked(grid_page: str) -> None:
    assert '<mark class="want">Madrid</mark>' in grid_page and '<mark class="got">Barcelona</mark>' in grid_page
    assert 'The capital of Italy is <mark class="want">Rome</mark>.' in grid_page
    assert 'The capital of Italy is <mark class="got">Milan</mark>.' in grid_page
    assert 'Berlin<mark class="got">, the capital of Germany</mark>' in grid_page
    assert "first difference at character 0 (lengths 6 and 9)" in grid_page


def test_identical_trials_are_shown_once(grid_page: str) -> None:
    assert "<b>trials 0, 1, 2: same trajectory</b>" in grid_page  # it: the same wrong answer three times
    assert "<b>trials 0, 2: same trajectory</b>" in grid_page  # es: right twice
    # fr 1 group, es 2, it 1, de 2 (its trial 2 never ran): 6 trajectories, not 11
    assert grid_page.count("<summary>trajectory: ") == 6
    for trial in (1, 2):  # the other trials of a group can still be linked to
        assert f'<span id="a2-{trial}"></span>' in grid_page


def test_failed_attempts_open_and_passed_ones_folded(grid_page: str) -> None:
    attempts = re.findall(r'<details class="attempt (\w+)" id="(a\d+-\d+)"( open)?', grid_page)
    assert attempts, "no attempts"
    assert {(outcome, bool(open_)) for outcome, _, open_ in attempts} == {
        ("fail", True),
        ("error", True),
        ("pass", False),
    }
    assert {anchor for _, anchor, _ in attempts} >= {"a0-0", "a1-0", "a1-1", "a2-0", "a3-0", "a3-1"}


def test_the_page_reads_without_its_script(grid_page: str) -> None:
    # the filter and sort appear only when the script runs; nothing else starts hidden
    assert '<div class="toolbar" id="toolbar" hidden>' in grid_page
    assert grid_page.count(" hidden") == 1
    for label in ('id="f-task"', 'id="f-outcome"', 'id="f-metric"', 'id="f-sort"'):
        assert label in grid_page
    assert '<option value="exact-match">exact-match</option>' in grid_page
    assert html.escape(SCRIPT) in grid_page and grid_page.lower().count("<script") == 1


def test_markdown_lists_the_failing_examples() -> None:
    md = markdown(_grid_run(), _grid_scores(), _grid_trajectories(), GRID_TASKS)
    assert "| `es` | pass | **FAIL** | pass | 1 of 3 |" in md
    assert "| `de` | pass | **error** | infra error | 1 of 3 |" in md
    assert "## Failing examples (5 failed or errored attempts)" in md
    assert "### `it` trials 0, 1, 2 (same trajectory)" in md
    es = md[md.index("### `es` trial 1") :]
    assert es.index("`exact-match` fail (builtin/exact-match): output differs") < es.index("expected:")
    assert "expected:\n\n```text\nMadrid\n```\n\nactual:\n\n```text\nBarcelona\n```" in es
    assert "`exact-match` error (builtin/exact-match): judge_timeout; the judge did not answer" in md
    # without scores it is the summary alone, as before
    assert "Failing examples" not in markdown(_grid_run())


def test_the_docs_say_what_the_report_shows() -> None:
    from evalsi.run_harness.commands import MAX_REPORTED_TRAJECTORIES
    from evalsi.run_harness.report import MAX_MARKDOWN_EXAMPLES

    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "harness.md").read_text().split())
    assert f"At most {MAX_EXAMPLES} attempts are shown in detail" in doc
    assert f"loads at most {MAX_REPORTED_TRAJECTORIES} trajectories" in doc
    assert f"at most {MAX_MARKDOWN_EXAMPLES} examples" in doc
    assert '"trials 0, 2: same trajectory"' in doc and "nothing is loaded from the network" in doc


# --- rendered in a browser ----------------------------------------------------------------------------------------


def _read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG, filters undone."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), None
    palette = b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    assert header is not None, "no IHDR"
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and interlace == 0, f"unsupported PNG: depth {depth}, interlace {interlace}"
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    bpp, stride = channels, width * channels
    raw = zlib.decompress(bytes(idat))
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        else:
            assert kind == 0, f"unknown PNG filter {kind}"
        rows.append(bytes(line))
        prev = line
    if color == 3:  # palette: expand to RGB
        rows = [b"".join(palette[3 * i : 3 * i + 3] for i in row) for row in rows]
    return width, height, rows


def _pixels(png: bytes) -> Counter[bytes]:
    width, _, rows = _read_png(png)
    size = len(rows[0]) // width
    return Counter(row[i : i + size] for row in rows for i in range(0, len(row), size))


def test_png_reader_undoes_every_filter() -> None:
    width, height, channels = 5, 5, 3
    image = [
        bytes((x * 40 + y * 7 + c * 3) % 256 for x in range(width) for c in range(channels)) for y in range(height)
    ]
    bpp = channels

    def filtered(kind: int, line: bytes, prev: bytes) -> bytes:
        out = bytearray()
        for i, v in enumerate(line):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            predictor = [0, a, b, (a + b) >> 1, min((a, b, c), key=lambda q: (abs(p - q), (a, b, c).index(q)))][kind]
            out.append((v - predictor) & 0xFF)
        return bytes([kind]) + bytes(out)

    raw = b"".join(filtered(y % 5, line, image[y - 1] if y else bytes(len(line))) for y, line in enumerate(image))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    assert _read_png(png) == (width, height, image)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


PROBE = """
window.addEventListener("load", function () {
  var out = {};
  function seen(el) { return !!el && el.getClientRects().length > 0; }
  function rows() {
    return Array.from(document.querySelectorAll("#grid tbody tr")).filter(seen).map(function (tr) {
      return [tr.querySelector("th").textContent, Array.from(tr.querySelectorAll("td")).filter(function (td) {
        return td.classList.contains("cell");
      }).map(function (td) {
        return [td.className.replace("cell ", "").replace(" dim", ""), td.textContent, td.classList.contains("dim")];
      })];
    });
  }
  function names(list) { return list.map(function (r) { return r[0]; }); }
  function cards() {
    return Array.from(document.querySelectorAll("#attempts .task")).filter(seen).map(function (c) {
      return c.querySelector("h3 code").textContent;
    });
  }
  function set(id, value, kind) {
    var el = document.getElementById(id);
    el.value = value;
    el.dispatchEvent(new Event(kind));
  }
  function done() { document.body.setAttribute("data-probe", JSON.stringify(out)); }
  try {
    var grid = document.getElementById("grid");
    out.gridBottom = grid.getBoundingClientRect().bottom;
    out.rows = rows();
    out.toolbar = seen(document.getElementById("toolbar"));
    var es = document.getElementById("a1-1");
    var e = es.querySelector(".expected pre"), a = es.querySelector(".actual pre");
    var re = e.getBoundingClientRect(), ra = a.getBoundingClientRect();
    out.versus = {expected: e.textContent, actual: a.textContent, sameRow: Math.abs(re.top - ra.top) < 2,
                  leftOf: re.right <= ra.left, seen: seen(e) && seen(a),
                  marked: Array.from(es.querySelectorAll("mark")).map(function (m) {
                    return m.className + ":" + m.textContent; })};
    set("f-task", "italy", "input");
    out.typed = {rows: names(rows()), cards: cards()};
    set("f-task", "", "input");
    set("f-outcome", "failing", "change");
    out.failing = {rows: rows(), attempts: Array.from(document.querySelectorAll("#attempts .attempt"))
      .filter(seen).map(function (d) { return d.id; })};
    set("f-outcome", "all", "change");
    set("f-sort", "failing", "change");
    out.sorted = {rows: names(rows()), cards: cards()};
    set("f-sort", "order", "change");
    var folded = document.getElementById("a0-0");
    out.foldedBefore = !folded.open;
    document.querySelector('#grid a[href="#a0-0"]').click();
    setTimeout(function () {
      out.openedByCell = folded.open;
      out.inView = folded.getBoundingClientRect().top < window.innerHeight;
      done();
    }, 300);
  } catch (err) {
    out.error = String(err);
    done();
  }
});
"""
"""What a person does on the page, read back from the rendered DOM: the grid's visible rows and cells, where the
expected and the actual output stand, what typing in the filter, choosing an outcome and a sort order leave
visible, and whether a grid cell opens its folded attempt."""


def _chromium_argv(binary: str, tmp_path: Path, *args: str) -> list[str]:
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900", *args]  # fmt: skip


def _as_seen(binary: str, tmp_path: Path, page: str) -> dict[str, Any]:
    """The page with PROBE after it, rendered by Chromium; what the probe found."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", f"<script>{PROBE}</script></body>"), encoding="utf-8")
    argv = _chromium_argv(binary, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    found = re.search(r'<body data-probe="([^"]*)"', done.stdout)
    assert found, f"the probe did not finish (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def test_a_person_reads_the_grid_and_the_difference_in_chromium(tmp_path: Path, grid_page: str) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary found (looked for chromium, chromium-browser, google-chrome on PATH)")
    seen = _as_seen(binary, tmp_path, grid_page)
    assert "error" not in seen, seen.get("error")
    # the grid: one row per task, one cell per trial with its outcome, above the fold of a 1280 x 900 window
    marks = {"pass": "✓", "fail": "✗", "error": "!", "infra": "∅"}
    assert seen["rows"] == [
        [task, [[o, marks[o], False] for o in outcomes]] for task, outcomes in GRID.items()
    ]  # fmt: skip
    assert seen["gridBottom"] < 900, f"the grid ends at {seen['gridBottom']} px, below the fold"
    assert seen["toolbar"]
    # expected and actual side by side, the differing words marked
    versus = seen["versus"]
    assert versus["seen"] and versus["sameRow"] and versus["leftOf"], versus
    assert (versus["expected"], versus["actual"]) == ("Madrid", "Barcelona")
    assert versus["marked"] == ["want:Madrid", "got:Barcelona"]
    # typing in the filter hides the other tasks, in the grid and below it
    assert seen["typed"] == {"rows": ["it"], "cards": ["it"]}
    # failed or errored only: fr goes, the others keep their failing cells, the rest dimmed; passed attempts hide
    failing = {task: [(o, dim) for o, _, dim in cells] for task, cells in seen["failing"]["rows"]}
    assert failing == {
        "es": [("pass", True), ("fail", False), ("pass", True)],
        "it": [("fail", False)] * 3,
        "de": [("pass", True), ("error", False), ("infra", True)],
    }
    assert sorted(seen["failing"]["attempts"]) == ["a1-1", "a2-0", "a3-1"]
    # most failing trials first, ties in the dataset's order
    assert seen["sorted"] == {"rows": ["it", "es", "de", "fr"], "cards": ["it", "es", "de", "fr"]}
    # a cell opens its folded attempt and brings it into view
    assert seen["foldedBefore"] and seen["openedByCell"] and seen["inView"]


def test_renders_in_headless_chromium(tmp_path: Path, grid_page: str) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary found (looked for chromium, chromium-browser, google-chrome on PATH)")
    report = tmp_path / "report.html"
    report.write_text(grid_page, encoding="utf-8")
    shot = tmp_path / "shot.png"
    argv = _chromium_argv(binary, tmp_path, f"--screenshot={shot}", report.as_uri())
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert shot.exists(), f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    pixels = _pixels(shot.read_bytes())
    total = sum(pixels.values())
    background, count = pixels.most_common(1)[0]
    assert total == 1280 * 900
    assert (total - count) / total > 0.01, f"the page looks blank: almost all pixels are #{background.hex()}"
    assert len(pixels) >= 3, f"only {len(pixels)} colors"

    # above the fold, the grid's cells (each some 1,500 px): 7 green, 4 red beside the FAIL banner (some 10,000 px of
    # the same red), 1 orange; the page without the grid has about 450, 10,100 and 0
    def colored(hex_: str) -> int:
        return sum(n for rgb, n in pixels.items() if rgb[:3] == bytes.fromhex(hex_))

    assert colored("dafbe1") > 5_000, "no passed cells above the fold"
    assert colored("ffebe9") > 14_000, "no failed cells above the fold"
    assert colored("fff1e5") > 1_000, "no errored cell above the fold"
