"""`evalsi keys`: API keys for the config's `auth` section."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from evalsi.cli.config import JsonOpt
from evalsi.cli.render import err, out

app = typer.Typer(help="API keys for the `auth` section.", no_args_is_help=True)


@app.command("new")
def keys_new(
    name: Annotated[str, typer.Option("--name", help="Whose key it is (shown in logs, never the key).")] = "",
    project: Annotated[
        str, typer.Option("--project", help="The project a request with this key is for (`api_keys[].project`).")
    ] = "default",
    as_json: JsonOpt = False,
    export: Annotated[
        bool,
        typer.Option(
            "--export",
            help="Print shell lines setting EVALSI_API_KEY_HASH (read by deploy/evalsi.yaml) and EVALSI_API_KEY "
            '(read by the CLI): eval "$(evalsi keys new --export)".',
        ),
    ] = False,
) -> None:
    """Make an API key: the key (give it to the sender, once) and its hash (for the config's `auth.api_keys`)."""
    import shlex

    from evalsi.auth.keys import KEY_ENV, new_key
    from evalsi.auth.principal import PROJECT_PATTERN

    if not PROJECT_PATTERN.fullmatch(project):
        raise typer.BadParameter(
            f"{project!r} is not a project name: lowercase letters, digits, `_` and `-`, starting with a letter or a "
            "digit, at most 63 characters",
            param_hint="--project",
        )
    key, digest = new_key()
    if export:
        sys.stdout.write(f"export {KEY_ENV}_HASH={shlex.quote(digest)}\nexport {KEY_ENV}={shlex.quote(key)}\n")
        return
    if as_json:
        out.print_json(json.dumps({"key": key, "hash": digest, "name": name, "project": project}))
        return
    out.print(f"key:  {key}", highlight=False)
    out.print(f"hash: {digest}", highlight=False)
    entry = f"{{hash: {digest}" + (f", name: {name}" if name else "") + f", project: {project}}}"
    err.print(
        "The key is shown once: give it to the sender (`Authorization: Bearer <key>`; `EVALSI_API_KEY` for the CLI)."
        f"\nIn the config:\n  auth:\n    api_keys:\n      - {entry}",
        highlight=False,
        soft_wrap=True,
    )
