"""`python -m evalsi.cli` runs the CLI, as `python -m evalsi` does."""

from evalsi.cli.main import app

app()
