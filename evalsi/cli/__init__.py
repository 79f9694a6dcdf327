"""The `evalsi` command: serve, validate, read traces, sessions, scores, policies and alerts, import and run.

Thin: each command calls into the packages. One module per command group (`traces`, `sessions`, `scores`,
`evaluators`, `policies`, `alerts`, `keys`, `imports`, `normalize`, and `serve` with `validate`), `main` putting them
together with the harness's commands (`evalsi.run_harness.commands`), `config` finding the config a command uses,
`source` choosing what a read command reads, `api` the client of a running collector's API, and `render` how it all
prints.

It starts fast: only typer and rich's console load at start; the collector, the store, the exporters and their
libraries load in the command that needs them (`evalsi --help` touches none)."""

from evalsi.cli.main import app

__all__ = ["app"]
