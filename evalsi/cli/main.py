"""The `evalsi` app: each command group of this package and the harness's commands, put together in the order
`evalsi --help` lists them."""

from __future__ import annotations

import typer

from evalsi.cli import alerts, datasets, evaluators, imports, keys, normalize, policies, scores, serve, sessions, traces
from evalsi.cli.config import discover_group, discovering
from evalsi.run_harness import commands

# plain help (rich_markup_mode=None): typer's rich help formatter alone takes longer to import than the whole CLI
app = typer.Typer(help="evalsi: an OpenTelemetry collector that turns GenAI traces into evaluations.",
                  no_args_is_help=True, add_completion=True, rich_markup_mode=None)  # fmt: skip
app.add_typer(traces.app, name="traces")
app.add_typer(sessions.app, name="sessions")
app.add_typer(scores.app, name="scores")
app.add_typer(evaluators.app, name="evaluators")
app.add_typer(policies.app, name="policies")
app.add_typer(alerts.app, name="alerts")
app.add_typer(datasets.app, name="datasets")

app.command("run")(discovering(commands.run_command))
app.add_typer(discover_group(commands.runs_app), name="runs")
app.command("compare")(discovering(commands.compare_command))
app.command("rescore")(discovering(commands.rescore_command))
app.add_typer(discover_group(commands.import_app), name="import")
commands.import_app.command("mlflow")(discovering(imports.import_mlflow))
commands.import_app.command("phoenix")(discovering(imports.import_phoenix))
commands.import_app.command("langfuse")(discovering(imports.import_langfuse))
app.add_typer(keys.app, name="keys")

app.command("serve")(serve.serve)
app.command("validate")(serve.validate)
app.command("version")(serve.version)
app.command("normalize")(normalize.normalize_command)
