"""The two ways to reach ClickHouse: the embedded engine (chDB, one process per data directory) and a server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import pyarrow as pa

from evalsi.embedded_store import SERVED_BY, StoreLocked, wait_for_store
from evalsi.exporters.clickhouse.schema import EMBEDDED_TABLE_SETTINGS, insert_sql
from evalsi.runtime.pandas_hidden import pandas_hidden
from evalsi.store import StoreError

# ClickHouse errors that an insert raises for the data it was given: the same rows fail again, other rows pass.
# Everything else (disk full, memory, too many parts, a server down, a timeout) is about the store's availability
# and passes once the store recovers.
DATA_ERRORS = frozenset(
    {
        "ARGUMENT_OUT_OF_BOUND", "BAD_ARGUMENTS", "CANNOT_CONVERT_TYPE", "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
        "CANNOT_PARSE_BOOL", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
        "CANNOT_PARSE_NUMBER", "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_TEXT", "DECIMAL_OVERFLOW",
        "ILLEGAL_COLUMN", "ILLEGAL_TYPE_OF_ARGUMENT", "INCORRECT_DATA", "SIZES_OF_ARRAYS_DONT_MATCH",
        "SIZES_OF_NESTED_COLUMNS_ARE_INCONSISTENT", "TOO_LARGE_ARRAY_SIZE", "TOO_LARGE_STRING_SIZE", "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    }
)  # fmt: skip
# raised before anything reaches the store, while rows are put in columns: a value the column type cannot hold
CONVERSION_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError)
_ERROR_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)")


def error_reason(error: BaseException) -> str:
    """A short name for a failed write: ClickHouse's error name (e.g. NOT_ENOUGH_SPACE), else the exception type."""
    found = _ERROR_NAME.findall(str(error))
    return found[-1] if found else type(error).__name__


def is_data_error(error: BaseException) -> bool:
    """Whether a write failed for the rows it carried (drop them alone) rather than for the store (retry)."""
    reason = error_reason(error)
    if reason in DATA_ERRORS:
        return True
    if reason == "TOO_MANY_PARTS" and "partitions for single INSERT block" in str(error):
        return True  # rows spread over too many days for one insert: smaller inserts pass
    return isinstance(error, CONVERSION_ERRORS) and not _ERROR_NAME.search(str(error))


class Backend(Protocol):
    description: str
    table_settings: Mapping[str, int]  # MergeTree settings of the traces and logs tables this backend creates

    def command(self, sql: str) -> None: ...

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def insert(self, table: str, data: pa.Table) -> None: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


class ChdbBackend:
    """The ClickHouse engine in-process. Calls are serialized: one session, used by the flush thread and readers."""

    table_settings = EMBEDDED_TABLE_SETTINGS

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = Path(path)
        self.description = f"embedded store at {self.path.absolute()}"
        if not create and not self.path.exists():
            raise StoreError(f"no store at {self.path}: nothing has been stored yet (start `evalsi serve` first)")
        serving = wait_for_store(self.path)  # a reading command lets go within a second: wait for it
        if serving is not None:
            what = "`evalsi run`" if serving.get("role") == "run" else "a collector"
            raise StoreLocked(
                f"store at {self.path} is locked by another evalsi process (pid {serving['pid']}): {what} whose "
                f"API at {serving['api']} serves it; stop that process or give this one another store endpoint"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the store directory {self.path}: {e.strerror}") from None
        from chdb import session  # imported here: loading the engine costs ~1 s

        try:
            self._session = session.Session(str(self.path))
        except Exception as e:  # chDB reports every open failure as a RuntimeError
            raise StoreError(f"cannot open the embedded store at {self.path}: {e}") from None
        self._lock = threading.Lock()

    def command(self, sql: str) -> None:
        with self._lock:
            self._session.query(sql)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        sql = sql + "\nSETTINGS output_format_json_quote_64bit_integers = 0"
        with self._lock:
            result = self._session.query(sql, "JSONEachRow", params=params or {})
        text = result.bytes() if hasattr(result, "bytes") else bytes(result)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def insert(self, table: str, data: pa.Table) -> None:
        batch = data  # noqa: F841 - chDB's Python() table function finds the table by this local name
        with self._lock, pandas_hidden():  # else chDB imports pandas to ask whether `batch` is a DataFrame
            self._session.query(insert_sql(table, data.schema, "Python(batch)"))

    def ping(self) -> bool:
        try:
            with self._lock:
                self._session.query("SELECT 1")
            return True
        except Exception:
            return False

    def announce(self, api: str, role: str) -> None:
        """Say in the store's directory that this process serves it through the API at `api` (`SERVED_BY`)."""
        record = self.path / SERVED_BY
        partial = record.with_suffix(".partial")
        partial.write_text(json.dumps({"pid": os.getpid(), "api": api, "role": role}))
        partial.replace(record)

    def withdraw(self) -> None:
        """This process no longer serves the store (it is stopping): readers wait for it, then open the store."""
        record = self.path / SERVED_BY
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text()).get("pid") == os.getpid():
                record.unlink()

    def close(self) -> None:
        self.withdraw()
        with self._lock:
            self._session.close()


@dataclass(frozen=True)
class ServerOptions:
    """How to reach a ClickHouse server beyond its URL and credentials."""

    async_insert: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    server_name: str | None = None


class ServerBackend:
    """A ClickHouse server over HTTP(S), through clickhouse-connect. `create`: make the database if it is missing."""

    table_settings: Mapping[str, int] = MappingProxyType({})

    def __init__(
        self, url: str, *, database: str, username: str, password: str, timeout: float, create: bool = True,
        options: ServerOptions = ServerOptions(),
    ) -> None:  # fmt: skip
        u = urlparse(url)
        self.description = f"ClickHouse server at {u.scheme}://{u.hostname}:{u.port or 8123}"
        self.database = database
        secure = u.scheme == "https"
        self._connect = dict(
            host=u.hostname or "localhost",
            port=u.port or (8443 if secure else 8123),
            username=unquote(u.username) if u.username else username,
            password=unquote(u.password) if u.password else password,
            secure=secure,
            verify=options.verify,
            ca_cert=options.ca_file,
            client_cert=options.cert_file,
            client_cert_key=options.key_file,
            server_host_name=options.server_name,
            connect_timeout=timeout,
            send_receive_timeout=timeout,
        )
        # inserts wait for an async insert's write: a row is counted stored once it is in a part, not in a buffer
        self._insert_settings = {"async_insert": 1, "wait_for_async_insert": 1} if options.async_insert else {}
        try:
            self._client = self._open(database)
        except Exception as e:
            if error_reason(e) != "UNKNOWN_DATABASE" or not create:
                raise StoreError(f"cannot reach the {self.description}: {_first_line(e)}") from None
            try:  # the OpenTelemetry Collector's exporter creates its database too
                self._client = self._open("")
                self._client.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
                self._client.database = database
            except Exception as e2:
                raise StoreError(
                    f"the {self.description} has no database {database!r} and it could not be created "
                    f"({_first_line(e2)}): create it, or grant CREATE DATABASE to the user"
                ) from None
        self._lock = threading.Lock()

    def _open(self, database: str) -> Any:
        import clickhouse_connect

        return clickhouse_connect.get_client(database=database or None, **self._connect)

    def command(self, sql: str) -> None:
        with self._lock:
            self._client.command(sql)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._client.query(sql, parameters=params or {}).named_results())

    def insert(self, table: str, data: pa.Table) -> None:
        with self._lock:
            self._client.insert_arrow(table, data, settings=self._insert_settings or None)

    def ping(self) -> bool:
        with self._lock:
            return bool(self._client.ping())

    def close(self) -> None:
        self._client.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:500]


def open_backend(
    endpoint: str, *, database: str = "default", username: str = "default", password: str = "",
    timeout: float = 10.0, create: bool = True, server: ServerOptions = ServerOptions(),
) -> Backend:  # fmt: skip
    if endpoint.startswith("chdb://"):
        return ChdbBackend(endpoint.removeprefix("chdb://"), create=create)
    if endpoint.startswith(("http://", "https://")):
        return ServerBackend(
            endpoint, database=database, username=username, password=password, timeout=timeout, create=create,
            options=server,
        )  # fmt: skip
    raise StoreError(f"unsupported store endpoint {endpoint!r}: use chdb://PATH or http(s)://host:8123")
