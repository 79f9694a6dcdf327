"""`python -m evalsi` runs the CLI."""

from evalsi.cli import app

app()
