"""The README's trace-reading examples, run as written against the capture the README sends
(`tests/fixtures/otel-openai-v2-latest/chat_tools.json`): each must find its trace."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
from running_collector import FIXTURES, serve_config, start_collector

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- run on the fixture: (?P<fixture>\S+) -->\n```bash\n(?P<body>.*?)```", re.S)


def _examples() -> list[tuple[Path, list[list[str]]]]:
    found = []
    for m in MARKER.finditer((ROOT / "README.md").read_text()):
        commands = [shlex.split(line)[1:] for line in m.group("body").splitlines() if line.startswith("evalsi ")]
        found.append((ROOT / m.group("fixture"), commands))
    return found


def test_the_readme_examples_find_the_readme_fixtures_trace(tmp_path: Path) -> None:
    [(fixture, commands)] = _examples()
    assert fixture.parent.parent == FIXTURES and len(commands) >= 4
    assert (
        "curl" in (ROOT / "README.md").read_text()
        and f"@{fixture.relative_to(ROOT)}" in (ROOT / "README.md").read_text()
    ), "the README sends this fixture"
    body = json.loads(fixture.read_text())
    trace_id = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    try:
        sent = httpx.post(c.http + "/v1/traces", content=fixture.read_bytes(),
                          headers={"Content-Type": "application/json"})  # fmt: skip
        assert sent.status_code == 200, sent.text
        assert c.wait_stored(4) == 4
        for args in commands:
            res = c.cli(*args)  # as written (through this collector's API)
            assert res.stdout.strip() and "no traces" not in res.stdout, (args, res.stdout)
            doc = json.loads(c.cli(*args, "--json").stdout)
            if args[:2] == ["traces", "list"]:
                assert [t["trace_id"] for t in doc] == [trace_id], (args, doc)
            else:
                assert {s["trace_id"] for s in doc["spans"]} == {trace_id}, (args, doc)
    finally:
        assert c.stop() == 0
