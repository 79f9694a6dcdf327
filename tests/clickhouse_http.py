"""A stand-in for a ClickHouse server's HTTP interface, for tests: the subset that clickhouse-connect uses (ping,
queries with bound parameters, commands, inserts with a body), answered by the real ClickHouse engine (chDB).

It is not a claim of server compatibility. What it checks and what it does not:
- the engine is real: SQL, types, table engines, parameters and errors are ClickHouse's own (chDB 4.x embeds it);
- the transport is ClickHouse's documented HTTP interface as clickhouse-connect speaks it: `query` in the URL or the
  body, `param_<name>` bindings, `database`, `default_format`, Basic auth, a compressed request body
  (`Content-Encoding`), errors as HTTP 500 with `X-ClickHouse-Exception-Code` and the exception text;
- settings sent as URL parameters (async_insert, session_id…) are recorded for tests to check, not applied; TLS,
  users and grants, sessions and the server's own HTTP status mapping are not modelled. A real server is tested
  where `EVALSI_TEST_CLICKHOUSE_URL` is set.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import re
import subprocess
import sys
import tempfile
import threading
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse

from chdb import session as chdb_session

# INSERT INTO <table> [(<columns>)] FORMAT <format> — the data follows in the body
_INSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<table>[`\"\w.]+)\s*(?P<columns>\([^)]*\))?\s*(?:SETTINGS\s+[^F]*?)?FORMAT\s+(?P<format>\w+)\s*",
    re.I | re.S,
)
_FORMAT_AT_END = re.compile(r"\sFORMAT\s+(\w+)\s*;?\s*$", re.I)
_ERROR = re.compile(r"Code: (\d+)")
# names of the parameters that are not query settings (ClickHouse's HTTP interface)
_TRANSPORT = {"query", "database", "default_format", "query_id", "user", "password", "session_id", "session_timeout"}


@dataclass
class Request:
    """What the stand-in saw of one request: for tests asserting what the client sent."""

    method: str
    database: str
    sql: str
    settings: dict[str, str]
    params: dict[str, str]
    user: str
    body_bytes: int
    content_encoding: str


@dataclass
class ClickHouseHttp:
    """The stand-in server: `url` to give clickhouse-connect, `requests` it answered."""

    path: Path
    username: str = "default"
    password: str = ""
    port: int = 0  # 0: any free port
    requests: list[Request] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> ClickHouseHttp:
        self._session = chdb_session.Session(str(self.path))
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in._handle(self)

            def do_POST(self) -> None:
                stand_in._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            self._session.close()

    def settings_of(self, sql_start: str) -> list[dict[str, str]]:
        """The settings of the requests whose SQL starts with `sql_start` (case-insensitive)."""
        return [r.settings for r in self.requests if r.sql.lstrip().upper().startswith(sql_start.upper())]

    # -- one request ---------------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        args = dict(parse_qsl(url.query, keep_blank_values=True))
        if url.path == "/_stand_in/requests":  # not ClickHouse's: what tests read back of what the client sent
            body = json.dumps([asdict(r) for r in self.requests]).encode()
            return self._reply(h, 200, body, {"Content-Type": "application/json"})
        if url.path in ("/ping", "/replicas_status"):
            return self._reply(h, 200, b"Ok.\n", {"Content-Type": "text/plain"})
        if url.path != "/":
            return self._reply(h, 404, b"There is no handle " + url.path.encode() + b"\n", {})
        body = _read_body(h)  # read whole before any answer: what is left unread would be taken for the next request
        user, password = self._credentials(h, args)
        if (user, password) != (self.username, self.password):
            message = f"Code: 516. DB::Exception: {user}: Authentication failed: password is incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)"  # noqa: E501
            return self._error(h, 516, message, status=401)
        encoding = (h.headers.get("Content-Encoding") or "").lower()
        try:
            body = _decode(body, encoding)
        except ValueError as e:
            return self._error(h, 1000, f"Code: 1000. DB::Exception: {e} (UNKNOWN_EXCEPTION)", status=400)
        query = args.get("query", "")
        params = {k.removeprefix("param_"): v for k, v in args.items() if k.startswith("param_")}
        settings = {k: v for k, v in args.items() if k not in _TRANSPORT and not k.startswith("param_")}
        insert = _INSERT.match(query) if query else None
        sql = query if insert else (query + ("\n" if query and body else "") + body.decode("utf-8", "replace"))
        database = args.get("database") or "default"
        self.requests.append(Request(h.command, database, sql, settings, params, user, len(body), encoding))
        query_id = args.get("query_id") or str(uuid.uuid4())
        try:
            if insert:
                self._insert(database, insert, body)
                out, fmt = b"", ""
            else:
                fmt = args.get("default_format") or "TabSeparated"
                explicit = _FORMAT_AT_END.search(sql)
                if explicit:
                    fmt, sql = explicit.group(1), sql[: explicit.start()]
                out = self._query(database, sql, fmt, params)
        except Exception as e:  # chDB raises the engine's exception text
            text = str(e).strip()
            code = _ERROR.search(text)
            return self._error(h, int(code.group(1)) if code else 1000, text)
        headers = {
            "Content-Type": "application/octet-stream" if fmt in ("Native", "RowBinary", "Arrow") else "text/plain",
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": "UTC",
            "X-ClickHouse-Summary": '{"read_rows":"0","read_bytes":"0","written_rows":"0","written_bytes":"0",'
            '"total_rows_to_read":"0","result_rows":"0","result_bytes":"0","elapsed_ns":"0"}',
        }
        if fmt:
            headers["X-ClickHouse-Format"] = fmt
        self._reply(h, 200, out, headers)

    def _credentials(self, h: BaseHTTPRequestHandler, args: dict[str, str]) -> tuple[str, str]:
        auth = h.headers.get("Authorization") or ""
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return user, password
        user = h.headers.get("X-ClickHouse-User") or args.get("user") or "default"
        return user, h.headers.get("X-ClickHouse-Key") or args.get("password") or ""

    def _use(self, database: str) -> None:
        self._session.query(f"USE `{database}`")

    def _query(self, database: str, sql: str, fmt: str, params: dict[str, str]) -> bytes:
        with self._lock:
            self._use(database)
            result = self._session.query(sql, fmt, params=params) if params else self._session.query(sql, fmt)
        return result.bytes() if hasattr(result, "bytes") else bytes(result)

    def _insert(self, database: str, insert: re.Match[str], body: bytes) -> None:
        """The data of an INSERT in a temporary file read with the engine's `file()` table function, in the format the
        client named: the engine parses exactly what the client sent."""
        columns = insert.group("columns") or ""
        with tempfile.NamedTemporaryFile(suffix=".data", delete=False) as f:
            f.write(body)
        try:
            with self._lock:
                self._use(database)
                table, fmt = insert.group("table"), insert.group("format")
                self._session.query(f"INSERT INTO {table} {columns} SELECT * FROM file('{f.name}', {fmt})")
        finally:
            Path(f.name).unlink(missing_ok=True)

    def _error(self, h: BaseHTTPRequestHandler, code: int, message: str, *, status: int = 500) -> None:
        self._reply(h, status, (message + "\n").encode(), {"X-ClickHouse-Exception-Code": str(code)})

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request's body, sent with a Content-Length or chunked (clickhouse-connect streams inserts chunked)."""
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        parts = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
                    pass
                return b"".join(parts)
            parts.append(h.rfile.read(size))
            h.rfile.readline()  # the CRLF after each chunk
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def _decode(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


@dataclass
class StandInProcess:
    """The stand-in run as its own process, as a server is: the collector and the tests reach it only over HTTP."""

    proc: subprocess.Popen[str]
    url: str

    def requests(self) -> list[dict[str, Any]]:
        import httpx

        return httpx.get(self.url + "/_stand_in/requests", timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_stand_in(path: Path, *, username: str = "default", password: str = "", port: int = 0) -> StandInProcess:
    """The stand-in in its own process on `path`; `port` 0 takes a free one. Started again with the port it had, it
    serves the same data at the same URL (a server restarted after a crash)."""
    command = [sys.executable, __file__, "--path", str(path), "--username", username, "--password", password]
    proc = subprocess.Popen([*command, "--port", str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"the ClickHouse HTTP stand-in did not start (exit {proc.wait()})")
    return StandInProcess(proc, line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, help="the chDB data directory")
    parser.add_argument("--username", default="default")
    parser.add_argument("--password", default="")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free port)")
    args = parser.parse_args()
    server = ClickHouseHttp(Path(args.path), username=args.username, password=args.password, port=args.port).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    main()
