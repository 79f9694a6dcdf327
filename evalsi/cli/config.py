"""Which config a command uses and how it was found (`-c`, `$EVALSI_CONFIG`, `./evalsi.yaml`, the built-in default),
loading it with its errors printed for a person, and the options every read command shares."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from evalsi.cli.render import fail

if TYPE_CHECKING:
    from evalsi.collector.config import Config

CONFIG_ENV = "EVALSI_CONFIG"
LOCAL_CONFIG = "evalsi.yaml"

ConfigOpt = Annotated[
    Path | None,
    typer.Option("-c", "--config", help=f"Config file (YAML); default: ${CONFIG_ENV}, else ./{LOCAL_CONFIG}, else "
                 "built-in defaults that serve a laptop."),
]  # fmt: skip
ApiOpt = Annotated[
    str | None, typer.Option("--api", help="Read through this collector API (e.g. http://127.0.0.1:8080).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="Started since: a duration back from now (15m, 2h, 7d) or an ISO-8601 time "
                 "(2026-05-01T12:00:00Z; UTC unless it says)."),
]  # fmt: skip
UntilOpt = Annotated[str | None, typer.Option("--until", help="Started until: as --since.")]


class Found(NamedTuple):
    """The config a command uses and how it was found."""

    path: Path | None  # None: the built-in default
    source: str  # `-c x.yaml`, `EVALSI_CONFIG=x.yaml`, `./evalsi.yaml` or `the built-in default`

    def origin(self, key: str) -> str:
        """Where a setting came from, for messages: `from ./evalsi.yaml: service.api.endpoint`."""
        if self.path is None:
            return f"from the built-in default {key}; no -c, {CONFIG_ENV} or ./{LOCAL_CONFIG}"
        return f"from {self.source}: {key}"


def find_config(path: Path | None) -> Found:
    """The config a command uses: `-c`, else `EVALSI_CONFIG`, else `./evalsi.yaml`, else the built-in default."""
    if path is not None:
        return Found(path, f"-c {path}")
    env = os.environ.get(CONFIG_ENV, "").strip()
    if env:
        return Found(Path(env), f"{CONFIG_ENV}={env}")
    if Path(LOCAL_CONFIG).is_file():
        return Found(Path(LOCAL_CONFIG), f"./{LOCAL_CONFIG}")
    return Found(None, "the built-in default")


def discovering(command: Callable[..., Any]) -> Callable[..., Any]:
    """A harness command whose `config` is found like every other command's (it takes `-c` or the default)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["config"] = find_config(kwargs.get("config")).path
        return command(*args, **kwargs)

    return run


def discover_group(group: typer.Typer) -> typer.Typer:
    """`group` with each of its commands `discovering` its config."""
    for info in group.registered_commands:
        if info.callback is not None:
            info.callback = discovering(info.callback)
    return group


def nested(config_error: str) -> str:
    """A config error's text with each problem's further lines (a policy file's own errors under its
    `processors.<id>:` key) indented beneath it rather than at the margin."""
    head, *lines = config_error.splitlines()
    return "\n".join([head, *(line if line.startswith("  ") else f"    {line}" for line in lines)])


def load(found: Found) -> Config:
    """The found config, loaded; its errors (and where it was found) printed and the command ended."""
    from evalsi.collector.config import ConfigError, load_config

    try:
        return load_config(found.path)
    except ConfigError as e:
        how = "" if found.source.startswith("-c") or found.path is None else f"\n  (the config found as {found.source})"
        raise fail(nested(str(e)) + how) from None
