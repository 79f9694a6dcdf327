"""Docs that cannot drift: every YAML block and every `evalsi ...` command line of README.md and docs/**/*.md, checked
against the code that would read it.

YAML blocks (```yaml) are classified by their content, or by an HTML comment on the line before the fence:

- a whole evalsi config (it has `service.pipelines`) must pass `evalsi validate` as pasted (`parse_config`);
- a config fragment (only some of `receivers`, `processors`, `exporters`, `service`, `auth`) is validated inside a
  minimal config (an `otlp` receiver, a `clickhouse` exporter, a traces pipeline), which it extends or replaces;
- a policy (`kind: OnlineEvalPolicy`) goes through the policy loader, a run file (`kind: EvalRun`) through the run
  loader, and a lone `spec:` is a policy's, checked inside a policy document;
- `<!-- fragment -->`: a block with pipelines that still leaves sections out, checked as a config fragment;
  `<!-- fragment: EvalRun spec.target.openai -->` checks it at that key path of a minimal document of that kind;
- `<!-- not-evalsi: otelcol -->`: another tool's YAML (otelcol, kubernetes, compose, agentgateway, prometheus,
  grafana), checked as YAML only;
- `<!-- refused: text -->`: a config the doc shows evalsi refusing; it must be refused, with `text` in the error.

Anything else fails, naming the file and line. In ```sh, ```bash, ```shell and ```console blocks (and `$ ` lines of
plain blocks), and in inline code that starts `evalsi <command>`, every command that runs evalsi (`evalsi`,
`.venv/bin/evalsi`, `docker run --entrypoint evalsi IMAGE`, `docker exec CONTAINER evalsi`) must name commands the
CLI has and only options those commands take; `[--opt X]` synopsis brackets are read as the option, and `...` stands
for any command. Stand-ins fill what a reader has and the docs cannot hold: every `env:NAME` / `${env:NAME}` variable
is set (a key hash for `..._HASH`), the policy files a config names exist (one valid policy each), and so do files
named by absolute path under a `..._file` key (certificates, JWKS).
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from evalsi.auth import new_key
from evalsi.cli import app
from evalsi.collector.config import ConfigError, parse_config
from evalsi.evaluators import load_evaluators
from evalsi.policies.load import parse_policy
from evalsi.run_harness.spec import RunSpecError, parse_run

ROOT = Path(__file__).resolve().parents[1]
_, KEY_HASH = new_key()  # for `${env:..._HASH}` references and the fragments' `auth`
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*(?P<kind>fragment|not-evalsi|refused)\s*(?::\s*(?P<arg>.*?))?\s*-->")
SHELLS = ("sh", "bash", "shell", "console")
CONFIG_SECTIONS = {"receivers", "processors", "exporters", "service", "auth"}
# a fragment's surroundings: an API key, so that a fragment listening on 0.0.0.0 is not refused for want of one
MINIMAL_CONFIG: dict[str, Any] = {
    "auth": {"api_keys": [{"hash": KEY_HASH}]},
    "receivers": {"otlp": {}},
    "exporters": {"clickhouse": {}},
    "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
}
MINIMAL: dict[str, dict[str, Any]] = {
    "OnlineEvalPolicy": {
        "apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "docs-example"},
        "spec": {"cascade": [{"ref": "builtin/latency"}]},
    },
    "EvalRun": {
        "apiVersion": "evals.si/v1alpha1", "kind": "EvalRun", "metadata": {"name": "docs-example"},
        "spec": {"target": {"openai": {"base_url": "stub", "model": "stub-1"}}, "dataset": "tasks.jsonl"},
    },
}  # fmt: skip
# what a component a fragment's pipelines name, and do not define, stands in with (else its defaults)
STAND_IN_COMPONENTS: dict[str, dict[str, Any]] = {"evaluate": {"policies": ["policies/*.yaml"]}}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    text: str
    marker: tuple[str, str] | None  # (fragment | not-evalsi | refused, its argument)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str, text: str) -> list[Block]:
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = [s for s in text[: m.start()].splitlines() if s.strip()]
        marked = MARKER.search(before[-1]) if before else None
        indent = len(m.group("indent"))
        body = "".join(s[indent:] if s[:indent].isspace() else s for s in m.group("body").splitlines(keepends=True))
        marker = (marked.group("kind"), marked.group("arg") or "") if marked else None
        found.append(Block(doc, line, m.group("lang"), body, marker))
    return found


# --- YAML ------------------------------------------------------------------------------------------------------------


def _env_stand_ins(text: str) -> dict[str, str]:
    names = re.findall(r"\benv:([A-Za-z_]\w*)", text)
    return {name: KEY_HASH if name.endswith("HASH") else "docs-example" for name in names}


def _values(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a YAML document, nested ones included."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k), v
            yield from _values(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _values(v, key)


def _config_problems(doc: Any, where: str, text: str, base_dir: Path) -> list[str]:
    """`evalsi validate` of a config at `base_dir`, with stand-ins for its environment variables and the files it
    names (see the module doc); `text` is the block the config comes from."""
    policy = yaml.safe_dump(MINIMAL["OnlineEvalPolicy"])
    absolute: set[str] = set()
    for key, value in _values(doc):
        if key == "policies" and isinstance(value, list):
            for n, glob in enumerate(v for v in value if isinstance(v, str)):
                stand_in = base_dir / glob.replace("**/", "").replace("*", f"docs-example-{n}")
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.write_text(policy.replace("name: docs-example", f"name: docs-example-{stand_in.stem}"))
        elif key.endswith("_file") and isinstance(value, str) and value.startswith("/"):
            absolute.add(value)
    is_file = Path.is_file
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _env_stand_ins(text).items():
            mp.setenv(name, value)
        mp.setattr(Path, "is_file", lambda self: str(self) in absolute or is_file(self))
        try:
            parse_config(doc, source=where, base_dir=base_dir)
        except ConfigError as e:
            return [str(e)]
    return []


def _embedded_config(fragment: dict[str, Any]) -> dict[str, Any]:
    """The fragment inside MINIMAL_CONFIG: its components join the minimal ones, its service keys (pipelines
    included) replace the minimal ones, and a component its pipelines name but it does not define takes defaults."""
    doc = copy.deepcopy(MINIMAL_CONFIG)
    for section in ("receivers", "processors", "exporters"):
        doc.setdefault(section, {}).update(fragment.get(section) or {})
    doc["service"].update(fragment.get("service") or {})
    if "auth" in fragment:
        doc["auth"] = fragment["auth"]
    for pipe in (doc["service"].get("pipelines") or {}).values():
        for section in ("receivers", "processors", "exporters"):
            for cid in (pipe or {}).get(section) or []:
                doc[section].setdefault(cid, copy.deepcopy(STAND_IN_COMPONENTS.get(cid, {})))
    return doc


def _policy_problems(doc: Any, where: str) -> list[str]:
    errors: list[str] = []
    parse_policy(doc, where, load_evaluators(), errors, base_dir=ROOT, datasets_dir=ROOT / ".evalsi" / "datasets")
    return errors


def _run_problems(doc: Any, where: str) -> list[str]:
    try:
        parse_run(doc, where, ROOT)
    except RunSpecError as e:
        return [str(e)]
    return []


def _at(doc: dict[str, Any], path: str, fragment: Any) -> dict[str, Any]:
    """`doc` with `fragment`'s keys merged in at the dotted key path."""
    doc = copy.deepcopy(doc)
    node = doc
    for key in [k for k in path.split(".") if k]:
        node = node.setdefault(key, {})
    node.update(fragment)
    return doc


def _by_kind(kind: str, doc: Any, where: str) -> list[str]:
    if kind == "OnlineEvalPolicy":
        return _policy_problems(doc, where)
    if kind == "EvalRun":
        return _run_problems(doc, where)
    return [f"kind {kind!r} is read by nothing in evalsi (OnlineEvalPolicy, EvalRun)"]


def yaml_problems(block: Block, base_dir: Path) -> list[str]:
    """What is wrong with one YAML block, each problem a line of text; none when it is what it claims."""
    try:
        docs = [d for d in yaml.safe_load_all(block.text) if d is not None]
    except yaml.YAMLError as e:
        return [f"not YAML: {' '.join(str(e).split())}"]
    kind, arg = block.marker or ("", "")
    if kind == "not-evalsi":
        return [] if arg else ["`<!-- not-evalsi: TOOL -->` names the tool that reads the block"]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return ["an evalsi block is one YAML mapping; mark another tool's with `<!-- not-evalsi: TOOL -->`"]
    doc: dict[str, Any] = docs[0]

    def config_problems(config: dict[str, Any]) -> list[str]:
        return _config_problems(config, block.where, block.text, base_dir)

    if kind == "refused":
        problems = config_problems(doc)
        if not problems:
            return ["marked `refused`, but `evalsi validate` accepts it"]
        return [] if arg in problems[0] else [f"refused, but not for {arg!r}: {problems[0]}"]
    if kind == "fragment":
        of, _, path = arg.partition(" ")
        if of in ("", "config"):
            return config_problems(_embedded_config(doc))
        if of not in MINIMAL:
            return [f"`<!-- fragment: {arg} -->`: a fragment is of `config`, {' or '.join(MINIMAL)}"]
        return _by_kind(of, _at(MINIMAL[of], path, doc), block.where)
    if str(doc.get("apiVersion", "")).startswith("evals.si/"):
        return _by_kind(str(doc.get("kind")), doc, block.where)
    if set(doc) == {"spec"}:
        return _policy_problems(_at(MINIMAL["OnlineEvalPolicy"], "", doc), block.where)
    if set(doc) <= CONFIG_SECTIONS:
        whole = isinstance(doc.get("service"), dict) and "pipelines" in doc["service"]
        return config_problems(doc if whole else _embedded_config(doc))
    return [
        f"unclassified YAML (top-level keys {sorted(doc)}): an evalsi config or fragment, a policy, a run file, or "
        "marked `<!-- not-evalsi: TOOL -->` / `<!-- fragment: KIND PATH -->` on the line before the fence"
    ]


# --- command lines ---------------------------------------------------------------------------------------------------

ROOT_COMMAND = typer.main.get_command(app)
SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")", "$(", "`"}


def command_lines(block: Block) -> Iterator[str]:
    """The shell lines of a block, continuation lines joined; a plain block's `$ ` lines only."""
    if block.lang not in SHELLS and block.lang != "":
        return
    joined = re.sub(r"\\\n\s*", " ", block.text)
    for line in joined.splitlines():
        prompt = line.lstrip().startswith("$ ")
        if block.lang == "" and not prompt:
            continue
        yield line.lstrip()[2:] if prompt else line


def evalsi_invocations(line: str) -> Iterator[list[str]]:
    """The arguments of every evalsi run on a shell line (after the program: `traces list --json`)."""
    lexer = shlex.shlex(line.replace("[", " ").replace("]", " "), posix=True, punctuation_chars=";&|()`")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: not a line this can read, and not one a shell could either
        tokens = line.split("#")[0].split()
    segment: list[str] = []
    for token in [*tokens, ";"]:
        if token not in SEPARATORS and not set(token) <= set(";&|()`"):
            segment.append(token)
            continue
        while (segment and re.fullmatch(r"\w+=\S*", segment[0])) or segment[:1] in (["sudo"], ["exec"], ["env"]):
            segment.pop(0)
        program = segment[0] if segment else ""
        if program == "evalsi" or program.endswith("/evalsi"):
            yield segment[1:]
        elif program == "docker" and "--entrypoint" in segment:
            at = segment.index("--entrypoint")
            if segment[at + 1 : at + 2] == ["evalsi"]:
                yield segment[at + 3 :]  # after the image (or compose service)
        elif program == "docker":
            for i in range(1, len(segment)):
                if segment[i] == "evalsi" and segment[i - 1] == "evalsi":  # exec CONTAINER evalsi ...
                    yield segment[i + 1 :]
                    break
        segment = []


def cli_problem(args: list[str]) -> str | None:
    """Why `evalsi ARGS` names a command or an option the CLI does not have; None when it does not."""
    command: Any = ROOT_COMMAND  # a click command (typer's vendored click): a group has `commands`
    path = ["evalsi"]
    rest = list(args)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        if rest[0] in ("...", "…"):
            return None
        sub = command.commands.get(rest[0])
        if sub is None:
            return f"`{' '.join(path)}` has no command {rest[0]!r} (it has: {', '.join(sorted(command.commands))})"
        command = sub
        path.append(rest.pop(0))
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} | {"--help"}
    for arg in rest:
        name = arg.split("=", 1)[0]
        if name.startswith("-") and name != "-" and name not in options:
            return f"`{' '.join(path)}` has no option {name} (it has: {', '.join(sorted(options))})"
    return None


INLINE = re.compile(r"`((?:\S*/)?evalsi [a-z][^`\n]*)`")


def inline_commands(text: str) -> Iterator[tuple[int, str]]:
    """(line, command) of every inline code span outside the fenced blocks that runs evalsi."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in INLINE.finditer(prose):
        yield prose.count("\n", 0, m.start()) + 1, m.group(1)


# --- a doc -----------------------------------------------------------------------------------------------------------


def problems_in(doc: str, text: str, workdir: Path) -> list[str]:
    """Every problem of a Markdown document's examples, as `doc:line: problem`; configs are read in `workdir`."""
    problems = []
    for n, block in enumerate(blocks(doc, text)):
        if block.lang in ("yaml", "yml"):
            (base_dir := workdir / f"block-{n}").mkdir()
            problems += [f"{block.where}: {p}" for p in yaml_problems(block, base_dir)]
            continue
        for line in command_lines(block):
            for args in evalsi_invocations(line):
                problem = cli_problem(args)
                if problem is not None:
                    problems.append(f"{block.where}: {line.strip()}\n    {problem}")
    for line_number, command in inline_commands(text):
        for args in evalsi_invocations(command):
            problem = cli_problem(args)
            if problem is not None:
                problems.append(f"{doc}:{line_number}: `{command}`\n    {problem}")
    return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_example_in_the_doc_is_valid(doc: str, tmp_path: Path) -> None:
    problems = problems_in(doc, (ROOT / doc).read_text(), tmp_path)
    assert not problems, "\n".join(problems)


def test_the_docs_have_examples_of_each_kind() -> None:
    """The checker reads what the docs hold: if a fence or marker changed shape, it would check nothing."""
    found = [b for doc in DOCS for b in blocks(doc, (ROOT / doc).read_text())]
    assert len([b for b in found if b.lang == "yaml"]) >= 40
    assert {m[0] for b in found if (m := b.marker)} >= {"not-evalsi", "refused"}
    commands = [a for b in found for line in command_lines(b) for a in evalsi_invocations(line)]
    assert len(commands) >= 20
    assert {a[0] for a in commands if a} >= {"serve", "validate", "run", "keys", "traces", "scores", "normalize"}


def api_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the collector's API serves, FastAPI's own pages aside."""
    from fastapi.routing import APIRoute

    from evalsi.collector.api import build_api

    app = build_api(None, dict)
    return [
        (method, route.path.replace(":path}", "}"))
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
    ]


def test_every_api_route_is_in_docs_api_md_and_the_readme() -> None:
    api_md, readme = (ROOT / "docs/api.md").read_text(), (ROOT / "README.md").read_text()
    routes = api_routes()
    assert ("POST", "/v1/feedback") in routes and len(routes) >= 15
    missing = [f"{m} {p}" for m, p in routes if f"{m} {p}`" not in api_md and f"{m} {p}," not in api_md]
    assert not missing, f"docs/api.md's route table lacks {missing}"
    missing = [p for _, p in routes if f"{p}`" not in readme]
    assert not missing, f"README.md's endpoint table lacks {missing}"


# --- the checker catches a broken example ----------------------------------------------------------------------------

BROKEN = """\
# A broken page

```yaml
receivers:
  otlp: {}
exporters:
  clickhouse: {endpoint: chdb://.evalsi/store, flush_intervall: 1s}
service:
  pipelines:
    traces: {receivers: [otlp], exporters: [clickhouse]}
```

```yaml
processors:
  tail_sampling: {decision_wait: 5s, num_trace: 100}
```

```yaml
spec:
  cascade:
    - ref: builtin/no-such-evaluator
```

```yaml
gateways: {port: 3000}
```

Run `evalsi traces lst` to see them.

```bash
evalsi traces list --limit 5 --colour
evalsi trace list
cd examples && ../.venv/bin/evalsi serve -c evalsi.yaml --port 4318
docker run --rm --entrypoint evalsi evalsi:0.1.0 keys new --length 32
```

<!-- refused: can be reached from other machines -->
```yaml
receivers:
  otlp: {protocols: {http: {endpoint: 127.0.0.1:4318}}}
exporters:
  clickhouse: {}
service:
  pipelines:
    traces: {receivers: [otlp], exporters: [clickhouse]}
```
"""


def test_a_broken_example_is_caught_naming_its_file_and_line(tmp_path: Path) -> None:
    problems = problems_in("broken.md", BROKEN, tmp_path)
    joined = "\n".join(problems)
    assert "broken.md:3: invalid config broken.md:3:" in joined and "flush_intervall: unknown key" in joined
    assert "broken.md:13:" in joined and "processors.tail_sampling.num_trace" in joined
    assert "broken.md:18:" in joined and "builtin/no-such-evaluator" in joined
    assert "broken.md:24: unclassified YAML (top-level keys ['gateways'])" in joined
    assert "`evalsi traces list` has no option --colour" in joined
    assert "`evalsi` has no command 'trace'" in joined
    assert "`evalsi serve` has no option --port" in joined
    assert "`evalsi keys new` has no option --length" in joined
    assert "broken.md:38: marked `refused`, but `evalsi validate` accepts it" in joined
    assert "broken.md:28: `evalsi traces lst`\n    `evalsi traces` has no command 'lst'" in joined
    assert len(problems) == 10, joined


def test_a_correct_example_passes(tmp_path: Path) -> None:
    fixed = """\
```bash
evalsi traces list --limit 5 --json
docker exec -e EVALSI_API_KEY evalsi evalsi traces list --api http://127.0.0.1:8080
kubectl -n evalsi rollout status deployment/evalsi    # not evalsi's CLI
```

<!-- not-evalsi: agentgateway -->
```yaml
gateways: {port: 3000}
```
"""
    assert problems_in("fixed.md", fixed, tmp_path) == []
