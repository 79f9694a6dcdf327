"""Log record times the logs table cannot order by (it orders by `toUnixTimestamp(Timestamp)`, UInt32 seconds) are
clamped by the receiver like any out-of-range time, never acknowledged and then dropped by the store (a fuzz
finding: a record timed between 2106 and 2262 was)."""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from evalsi.receivers.otlp.decode import CLAMPED, MAX_LOG_TIME_NS, logs_from_request

YEAR_2200_NS = 7_258_118_400 * 10**9  # after 2106, before 2**63-1 ns


def _request(*times: tuple[int, int]) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    records = req.resource_logs.add().scope_logs.add().log_records
    for t, observed in times:
        records.append(LogRecord(time_unix_nano=t, observed_time_unix_nano=observed))
    return req


def test_a_time_past_2106_is_clamped_and_marked_and_the_other_time_kept() -> None:
    ok = 1_700_000_000 * 10**9
    decoded = logs_from_request(_request((YEAR_2200_NS, ok), (ok, YEAR_2200_NS), (MAX_LOG_TIME_NS, ok)))
    first, second, last = decoded.batch.records
    assert (first.time_unix_nano, first.observed_time_unix_nano, first.timestamp) == (0, ok, ok)
    assert first.attributes[CLAMPED] == ["time_unix_nano"]
    assert (second.time_unix_nano, second.observed_time_unix_nano) == (ok, 0)
    assert second.attributes[CLAMPED] == ["observed_time_unix_nano"]
    assert last.time_unix_nano == MAX_LOG_TIME_NS and CLAMPED not in last.attributes  # the last second it can order
    assert decoded.clamped == 2 and decoded.rejected == 0
