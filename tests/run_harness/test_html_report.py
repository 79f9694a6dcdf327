"""The HTML run report: its content, the escaping of untrusted values, no network references, and a headless
Chromium rendering checked for being non-blank (the PNG read with the standard library)."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evalsi.run_harness.html import MAX_EXAMPLES, MAX_TEXT, html_report
from evalsi.run_harness.report import metric_rows

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
    assert "Failing examples (2 failed or errored scores)" in page
    assert f"evalsi traces show {FAILING_TRACE}" in page
    assert "mismatch" in page and "judge_timeout" in page
    # the trajectory: tool call with its arguments, the tool's error, the long output cut with a visible marker
    assert "calculator" in page and "&quot;expression&quot;: &quot;6*7&quot;" in page
    assert "ZeroDivisionError: division by zero" in page
    assert "… (1,250 more characters)" in page  # "Let me compute. " is 16 characters more
    assert LONG not in page
    # the passing trace t1 is no example
    assert "t10".ljust(32, "0") not in page


def test_untrusted_values_are_escaped(page: str) -> None:
    assert html.escape(SCRIPT) in page
    assert "<script" not in page.lower()


def test_no_network_references(page: str) -> None:
    tags = re.findall(r"<[a-zA-Z][^>]*>", page)
    assert tags
    for tag in tags:
        for name, value in re.findall(r"""([\w:-]+)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", tag):
            assert name.lower() not in ("src", "href", "srcset", "action", "xlink:href", "poster"), tag
            assert not re.search(r"(?i)https?:|//|url\(", value), tag
    for tag in ("<link", "<img", "<iframe", "<object", "<embed", "<base", "<meta http-equiv"):
        assert tag not in page.lower()
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None and "url(" not in style.group(1) and "@import" not in style.group(1)
    # URLs in the data are there, as text
    assert "http:http://localhost:8080/agent" in page and "https://judge.example/v1" in page


def test_failing_examples_are_capped() -> None:
    scores = [
        {
            "trace_id": f"{i:032x}",
            "task_id": f"task-{i:04d}",
            "trial": 0,
            "name": "correct",
            "value": 0.0,
            "passed": False,
            "outcome": "scored",
            "reason": None,
            "explanation": None,
            "evaluator": "exact_match",
        }
        for i in range(MAX_EXAMPLES + 37)
    ]
    page = html_report(_run(), scores, {})
    assert "37 more failing scores are left out" in page
    assert page.count("evalsi traces show ") == MAX_EXAMPLES
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
    assert "no gates" in page and "No score failed or errored." in page


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


def test_renders_in_headless_chromium(tmp_path: Path, page: str) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary found (looked for chromium, chromium-browser, google-chrome on PATH)")
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    shot = tmp_path / "shot.png"
    argv = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        report.as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert shot.exists(), f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    pixels = _pixels(shot.read_bytes())
    total = sum(pixels.values())
    background, count = pixels.most_common(1)[0]
    assert total == 1280 * 2000
    assert (total - count) / total > 0.01, f"the page looks blank: almost all pixels are #{background.hex()}"
    assert len(pixels) >= 3, f"only {len(pixels)} colors"
