"""`evalsi serve` (run the collector), `evalsi validate` (check a config or a run file) and `evalsi version`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsi import __version__
from evalsi.cli.config import CONFIG_ENV, LOCAL_CONFIG, ConfigOpt, find_config, load, nested
from evalsi.cli.render import err, fail, out


def serve(config: ConfigOpt = None) -> None:
    """Run the collector until SIGTERM or Ctrl-C, then drain every buffer to the store."""
    import asyncio

    from evalsi.runtime.ports import claimed_in, taken

    found = find_config(config)
    busy = taken(claimed_in(found.path))  # before the imports and the config's components: a second serve fails at once
    if busy:
        raise fail("cannot start: " + "\n  ".join(busy))

    from evalsi.collector.logs import configure
    from evalsi.collector.service import Service, StartError
    from evalsi.store import StoreError

    cfg = load(found)
    logs = cfg.service.telemetry.logs
    configure(logs.level, logs.encoding)
    service = Service(cfg)
    try:
        asyncio.run(service.run())
    except (StartError, StoreError, OSError) as e:
        raise fail(f"cannot start: {e}") from None
    except KeyboardInterrupt:
        pass
    lost = service.unstored
    if lost:
        what = ", ".join(f"{n} {kind}" for kind, n in lost.items())
        raise fail(f"stopped with acknowledged data not stored: {what} (the log says why)")


def validate(
    config: Annotated[
        Path | None,
        typer.Option("-c", "--config", help=f"Config file to check; default: ${CONFIG_ENV}, else ./{LOCAL_CONFIG}."),
    ] = None,
    run_file: Annotated[Path | None, typer.Option("-f", "--file", help="EvalRun file to check.")] = None,
) -> None:
    """Check a config file (-c) or a run file (-f) without starting anything; print OK or every error."""
    from evalsi.collector.config import ConfigError, load_config, redact
    from evalsi.run_harness.dataset import DatasetError, load_dataset
    from evalsi.run_harness.runner import run_problems
    from evalsi.run_harness.spec import RunSpecError, load_run

    if config is None and run_file is None:
        config = find_config(None).path
        if config is None:
            raise fail(
                f"give a config (-c evalsi.yaml, ${CONFIG_ENV} or ./{LOCAL_CONFIG}) or a run file (-f run.yaml) to "
                "check"
            )
    problems = []
    notes = []
    if config is not None:
        try:
            loaded = load_config(config)
            if loaded.workers_note:
                notes.append(loaded.workers_note)
        except ConfigError as e:
            problems.append(nested(str(e)))
    if run_file is not None:
        try:
            spec = load_run(run_file)
            dataset = load_dataset(spec.path(spec.body.dataset.path), spec.body.dataset.limit, spec.body.dataset.format)
            problems.extend(f"{run_file}: {p}" for p in run_problems(spec, dataset.tasks))
        except (RunSpecError, DatasetError) as e:
            problems.append(str(e))
    if problems:
        # a config's errors are redacted already; a run file's are here, with the credentials it holds
        err.print(
            redact("\n".join(problems), _run_file_secrets(run_file)), highlight=False, soft_wrap=True, markup=False
        )
        raise typer.Exit(1)
    out.print(f"OK: {', '.join(str(p) for p in (config, run_file) if p is not None)}")
    for note in notes:
        out.print(f"  {note}", highlight=False)


def _run_file_secrets(path: Path | None) -> set[str]:
    import yaml

    from evalsi.collector.config import secret_values

    try:
        return secret_values(yaml.safe_load(path.read_text())) if path is not None else set()
    except (OSError, yaml.YAMLError):
        return set()


def version() -> None:
    """Print the evalsi version."""
    out.print(f"evalsi {__version__}")
