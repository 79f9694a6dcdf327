"""docs/security.md as a reader uses it: every config block is taken or refused by evalsi's parser as the page says,
with the key check it describes; the `evalsi keys new` output shown is what the command prints; the listener table
names every path the API serves and the ones it leaves open; the Prometheus block is a scrape config that sends a
key."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalsi.auth import Authenticator, Unauthenticated, hash_of, new_key
from evalsi.collector.api import OPEN_PATHS, build_api
from evalsi.collector.config import Config, ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]
DOC = "docs/security.md"
TEXT = (ROOT / DOC).read_text()
# a fenced block, also inside a list item (indented with it)
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{DOC}:{self.line}"

    @property
    def kind(self) -> str:
        m = re.match(r"#\s*(\w+):", self.text)
        return m.group(1) if m else ""


def blocks() -> list[Block]:
    found = []
    for m in FENCE.finditer(TEXT):
        indent = len(m.group("indent"))
        body = "".join(line[indent:] for line in m.group("body").splitlines(keepends=True))
        found.append(Block(TEXT.count("\n", 0, m.start()) + 1, m.group("lang"), body))
    return found


YAML = [b for b in blocks() if b.lang == "yaml"]
EVALSI = [b for b in YAML if b.kind == "evalsi"]


def test_every_yaml_block_names_what_reads_it() -> None:
    assert {b.kind for b in YAML} == {"evalsi", "prometheus"}, [(b.where, b.kind) for b in YAML]
    assert len(EVALSI) >= 5


# --- the config blocks ----------------------------------------------------------------------------------------------

# a fragment that shows only the `auth` section is checked inside the smallest config around it
AROUND: dict[str, Any] = {
    "receivers": {"otlp": {}},
    "exporters": {"clickhouse": {}},
    "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
}


def load(block: Block, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, str]]:
    """The block as evalsi reads it, and the key behind each `${env:VAR}` hash it takes from the environment."""
    keys = {}
    for name in re.findall(r"\$\{env:(\w+)\}", block.text):
        keys[name], digest = new_key()
        monkeypatch.setenv(name, digest)
    doc = yaml.safe_load(block.text)
    return ({**AROUND, **doc} if set(doc) == {"auth"} else doc), keys


def refusal_shown_after(block: Block) -> list[str]:
    """The error lines the page shows in the plain block that follows a refused config."""
    following = [b for b in blocks() if b.line > block.line]
    assert following and following[0].lang == "", f"{block.where}: show the error evalsi gives"
    return [line.strip() for line in following[0].text.splitlines() if line.strip()]


def check(config: Config, authorization: str | None) -> bool:
    assert config.auth is not None
    try:
        Authenticator(config.auth).check(authorization)
        return True
    except Unauthenticated:
        return False


@pytest.mark.parametrize("block", EVALSI, ids=lambda b: b.where)
def test_each_config_block_is_taken_or_refused_as_the_page_says(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    doc, keys = load(block, monkeypatch)
    if "refused" in block.text.splitlines()[0]:
        with pytest.raises(ConfigError) as refused:
            parse_config(doc, source=block.where)
        for line in refusal_shown_after(block):
            assert line in refused.value.errors, f"{block.where}: evalsi does not say {line!r}"
        return

    config = parse_config(doc, source=block.where)
    assert config.auth is not None
    mode = config.auth.mode
    assert mode == doc["auth"].get("mode", "strict")
    stranger = f"Bearer {new_key()[0]}"
    if mode == "none":
        assert not Authenticator(config.auth).enabled
        return
    assert not check(config, stranger), "a key that is not listed is refused"
    assert not check(config, "Basic dXNlcjpwYXNz") and not check(config, "Bearer")
    assert check(config, None) == (mode == "optional"), "strict refuses a request without a key, optional takes it"
    for key in keys.values():
        assert check(config, f"Bearer {key}"), "a key whose hash comes from the environment is taken"
    names = [k.name for k in config.auth.api_keys]
    assert all(names), "every key is named, for the logs"


def test_the_page_shows_strict_optional_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    modes = set()
    for block in EVALSI:
        doc, _ = load(block, monkeypatch)
        if "auth" in doc:
            modes.add(doc["auth"].get("mode", "strict"))
    assert modes == {"strict", "optional", "none"}


def test_the_rotation_block_lists_two_hashes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    [rotation] = [b for b in EVALSI if "moves to its new key" in b.text]
    config = parse_config(load(rotation, monkeypatch)[0])
    assert config.auth is not None and len(config.auth.api_keys) == 2


def test_the_mode_none_warning_is_the_one_evalsi_logs() -> None:
    shown = re.search(r"`(auth mode none: .*?)`", " ".join(TEXT.split()))
    assert shown, "the page quotes the warning"
    tree = ast.parse((ROOT / "evalsi/collector/service.py").read_text())
    logged = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "warning"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value).startswith("auth mode none")
    ]
    assert len(logged) == 1, "the service logs one such warning"
    # `(...)` on the page stands for what it leaves out
    quoted = "".join(
        r".*" if part == "(...)" else re.escape(part) for part in re.split(r"(\(\.\.\.\))", shown.group(1))
    )
    assert re.fullmatch(quoted, logged[0]), (shown.group(1), logged[0])


# --- evalsi keys new ------------------------------------------------------------------------------------------------


def shown_output(command: str) -> str:
    """What the page shows under `$ <command>`, up to the end of its block."""
    [block] = [b for b in blocks() if b.text.startswith(f"$ {command}\n")]
    return block.text.split("\n", 1)[1]


def pattern(shown: str) -> str:
    """The shown output as a regex: `...` stands for what differs from run to run."""
    return "".join(r"\S+" if part == "..." else re.escape(part) for part in re.split(r"(\.\.\.)", shown))


def run(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "evalsi", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_keys_new_prints_what_the_page_shows() -> None:
    out = run("keys", "new", "--name", "checkout-agent")
    shown = shown_output("evalsi keys new --name checkout-agent")
    assert re.fullmatch(pattern(shown.strip()), out.strip()), (shown, out)
    key = re.search(r"^key:\s+(\S+)$", out, re.M).group(1)  # type: ignore[union-attr]
    digest = re.search(r"^hash:\s+(\S+)$", out, re.M).group(1)  # type: ignore[union-attr]
    assert digest == hash_of(key)
    assert "`evk_` and 43 random URL-safe characters" in TEXT
    assert re.fullmatch(r"evk_[A-Za-z0-9_-]{43}", key)
    # what goes in the config is taken by the parser as the page's blocks write it
    config = parse_config({**AROUND, "auth": {"api_keys": [{"hash": digest, "name": "checkout-agent"}]}})
    assert check(config, f"Bearer {key}")


def test_keys_new_json_is_the_object_the_page_shows() -> None:
    made = json.loads(run("keys", "new", "--name", "checkout-agent", "--json"))
    shown = json.loads(shown_output("evalsi keys new --name checkout-agent --json"))
    assert list(made) == list(shown)
    for field, value in shown.items():
        assert re.fullmatch(pattern(value), made[field]), (field, made[field])
    assert made["hash"] == hash_of(made["key"])


# --- what each listener requires ------------------------------------------------------------------------------------


def api_rows() -> dict[str, list[str]]:
    """The listener table's rows for the API: what happens without a key -> the paths it names."""
    rows = {}
    for line in TEXT.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("the API"):
            rows[cells[2]] = re.findall(r"`(/[^`]*)`", cells[1])
    return rows


def test_the_listener_table_names_every_api_path() -> None:
    rows = api_rows()
    [open_paths] = [paths for outcome, paths in rows.items() if outcome.startswith("never refused")]
    assert set(open_paths) == set(OPEN_PATHS)
    [keyed] = [paths for outcome, paths in rows.items() if outcome.startswith("401")]
    served = {route.path for route in build_api(None, status=dict).routes}  # type: ignore[attr-defined]
    uncovered = sorted(p for p in served - set(OPEN_PATHS) if not any(fnmatchcase(p, shown) for shown in keyed))
    assert uncovered == [], "paths the API serves that the table does not name"


def test_the_prometheus_block_sends_the_key_from_a_file() -> None:
    [block] = [b for b in YAML if b.kind == "prometheus"]
    [job] = yaml.safe_load(block.text)["scrape_configs"]
    assert set(job) <= {"job_name", "authorization", "static_configs"}
    # Prometheus' authorization: `type` (default Bearer) and one of credentials / credentials_file
    assert set(job["authorization"]) == {"credentials_file"}
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert targets and all(t.endswith(":8888") for t in targets)
