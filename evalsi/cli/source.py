"""What a read command reads: the collector at `--api`; else the collector serving the found config's store; else
that store itself. And one read from it, its errors printed for a person."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import typer

from evalsi.cli.api import Api
from evalsi.cli.config import find_config, load
from evalsi.cli.render import fail

if TYPE_CHECKING:
    from evalsi.collector.query import TraceReader


class Source(NamedTuple):
    """What a read command reads, and the words that say so: `the collector at URL (from ./evalsi.yaml: ...)`."""

    reader: TraceReader
    named: str


def open_source(config: Path | None, api: str | None) -> Source:
    """`--api`; else the collector serving the found config's store (it recorded its API); else that store."""
    if api:
        reader = Api(api)
        return Source(reader, f"the collector at {reader.url} (from --api)")
    found = find_config(config)
    cfg = load(found)
    from evalsi.collector.query import ApiReader, QueryError, open_reader, store_of
    from evalsi.store import StoreError

    try:
        reader = open_reader(cfg, None)
    except (QueryError, StoreError) as e:
        raise fail(f"{e} (the config: {found.source})") from None
    store = (store_of(cfg) or ("",))[0]
    if isinstance(reader, ApiReader):
        return Source(reader, f"the collector at {reader.url} serving the store ({found.origin(f'exporters.{store}')})")
    return Source(reader, f"the {reader.where} ({found.origin(f'exporters.{store}')}; no collector serves it)")


def read(reader: TraceReader, fn: str, *args: Any, **kwargs: Any) -> Any:
    """`reader.fn(*args, **kwargs)`, then the reader closed; a failure printed as where it happened, no traceback."""
    try:
        return getattr(reader, fn)(*args, **kwargs)
    except typer.Exit:
        raise
    except Exception as e:
        query = sys.modules.get("evalsi.collector.query")  # loaded if the reader came from it
        if query is not None and isinstance(e, query.QueryError):
            raise fail(str(e)) from None
        raise fail(f"reading from the {reader.where} failed: {e}") from None  # a store error: where, no traceback
    finally:
        reader.close()
