"""Pipeline workers (`service.workers` > 1): the traces and logs pipelines run in N processes, sharded by trace id;
the receivers, the store and the scores pipeline stay in the collector process, which owns the store.

The receivers only parse and check a request, answer it, and hand its encoded body to every worker owning one of its
traces (`EncodedBatch`). Each worker decodes its own traces' spans and log records, runs the pipelines' processors,
and sends what the store takes back as Arrow tables (`rows.to_arrow`): the Python work per span is spread over the
cores, and one process still writes the store. A request is acknowledged (counted in flight) until each worker's
pipeline took it; a worker with `max_in_flight` requests not yet taken makes the receivers answer 429.

The pieces: `pool` (the collector side: spawns, shards to and restarts the workers), `worker` (a worker process's
runtime), `link` (in a worker, stands where the store exporter stands), `pipe` (message framing), `metrics` (the
processes' self-metrics merged into one exposition).
"""
