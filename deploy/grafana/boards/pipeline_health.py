"""The pipeline health dashboard (Prometheus: the collector's own metrics): ingest, queues and buffers, evictions,
shedding and redaction, pipeline workers, exporters and the store."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard

from boards.panels import RATE, new_dashboard, prom, row, single, ts


def pipeline_health() -> dashboard_b.Dashboard:
    dropped_parts = [
        "otelcol_exporter_enqueue_failed_spans_total",
        "otelcol_exporter_send_failed_spans_total",
        "evalsi_tail_sampling_spans_lost_total",
    ]
    dropped = " + ".join(f"(sum(increase({m}[$__range])) or vector(0))" for m in dropped_parts)
    store_state = [
        dashboard.ValueMap(
            options={
                "0": dashboard.ValueMappingResult(text="available", color="green"),
                "1": dashboard.ValueMappingResult(text="refusing writes", color="red"),
            },
        )
    ]
    return (
        new_dashboard(
            "evalsi-pipeline-health",
            "evalsi · pipeline health",
            "The collector's own metrics (service.telemetry.metrics): what the receivers took and refused, what was "
            "dropped, what waits in queues and buffers, evictions, redaction, pipeline workers and the store.",
        )
        .with_row(row("Ingest"))
        .with_panel(
            single(
                "Spans accepted /s",
                "Spans the OTLP receivers pushed into the pipelines (otelcol_receiver_accepted_spans_total).",
                prom(f"sum(rate(otelcol_receiver_accepted_spans_total{RATE}))"),
                unit="cps",
                span=6,
            )
        )
        .with_panel(
            single(
                "Spans refused /s",
                "Spans answered with an error (invalid, or refused by a full or unavailable pipeline: the sender "
                "keeps them and retries). otelcol_receiver_refused_spans_total.",
                prom(f"sum(rate(otelcol_receiver_refused_spans_total{RATE}))"),
                unit="cps",
                span=6,
                bad_above=0,
            )
        )
        .with_panel(
            single(
                "Spans dropped or lost in the range",
                "Accepted spans that were not stored: an exporter queue full (otelcol_exporter_enqueue_failed_spans), "
                "an exporter that gave up (otelcol_exporter_send_failed_spans), spans tail sampling could not hand on "
                "(evalsi_tail_sampling_spans_lost).",
                prom(dropped, instant=True),
                span=6,
                bad_above=0,
            )
        )
        .with_panel(
            single(
                "Store",
                "evalsi_exporter_store_unavailable: 1 while the store refuses writes for its availability (disk full, "
                "server down); the exporter's queue holds what was accepted meanwhile.",
                prom("max(evalsi_exporter_store_unavailable)"),
                span=6,
                bad_above=1,
                mappings=store_state,
            )
        )
        .with_panel(
            ts(
                "Spans accepted and refused /s",
                "By receiver and transport (grpc, http).",
                [
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_accepted_spans_total{RATE}))",
                        "accepted {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_refused_spans_total{RATE}))",
                        "refused {{receiver}} {{transport}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Log records accepted, refused and stored /s",
                "GenAI content often arrives as log records, joined to their spans by normalize; stored: "
                "otelcol_exporter_sent_log_records_total.",
                [
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_accepted_log_records_total{RATE}))",
                        "accepted {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_refused_log_records_total{RATE}))",
                        "refused {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_sent_log_records_total{RATE}))",
                        "stored by {{exporter}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Spans stored and sampled /s",
                "Spans the exporters sent (otelcol_exporter_sent_spans_total), and the sampling decisions: "
                "not_sampled spans of tail sampling are evaluated but not stored; the probabilistic sampler's are "
                "dropped.",
                [
                    prom(f"sum by (exporter) (rate(otelcol_exporter_sent_spans_total{RATE}))", "sent by {{exporter}}"),
                    prom(
                        f"sum by (processor, decision) (rate(evalsi_tail_sampling_spans_total{RATE}))",
                        "{{processor}} {{decision}}",
                    ),
                    prom(
                        f"sum by (processor, decision) (rate(evalsi_sampler_spans_total{RATE}))",
                        "{{processor}} {{decision}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Spans dropped or lost /s",
                "Queue full (enqueue_failed), given up after retries (send_failed), refused by the store for their "
                "data (evalsi_exporter_items_refused, the rest of their batch went on), lost by tail sampling.",
                [
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_enqueue_failed_spans_total{RATE}))",
                        "queue full {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_spans_total{RATE}))",
                        "gave up {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter, kind, reason) (rate(evalsi_exporter_items_refused_total{RATE}))",
                        "refused {{exporter}} {{kind}} {{reason}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_tail_sampling_spans_lost_total{RATE}))",
                        "lost in {{processor}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_row(row("Queues and buffers"))
        .with_panel(
            ts(
                "Exporter queue fill",
                "otelcol_exporter_queue_size / otelcol_exporter_queue_capacity: a store exporter refuses (429/503) "
                "when full, a score exporter drops its oldest.",
                [
                    prom(
                        "sum by (exporter) (otelcol_exporter_queue_size) "
                        "/ sum by (exporter) (otelcol_exporter_queue_capacity)",
                        "{{exporter}}",
                    )
                ],
                unit="percentunit",
                min_val=0,
                max_val=1,
                span=8,
            )
        )
        .with_panel(
            ts(
                "Held by processors",
                "Traces tail sampling buffers undecided, decided spans waiting for the next consumer, traces waiting "
                "for evaluation, open sessions, completed traces kept for late feedback.",
                [
                    prom("sum by (processor) (evalsi_tail_sampling_traces_buffered)", "traces buffered {{processor}}"),
                    prom(
                        "sum by (processor) (evalsi_tail_sampling_outbox_spans)",
                        "spans waiting {{processor}}",
                    ),
                    prom(
                        "sum by (processor) (evalsi_evaluate_queue_size)",
                        "traces waiting for {{processor}}",
                    ),
                    prom("sum by (processor) (evalsi_tail_sampling_sessions_open)", "sessions open"),
                    prom(
                        "sum by (processor) (evalsi_late_signals_buffered_traces)",
                        "traces kept for late feedback",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            ts(
                "Tail sampling buffer",
                "Estimated bytes of buffered spans (evalsi_tail_sampling_buffered_bytes).",
                [prom("sum by (processor) (evalsi_tail_sampling_buffered_bytes)", "{{processor}}")],
                unit="bytes",
                span=8,
            )
        )
        .with_row(row("Evictions, shedding and redaction"))
        .with_panel(
            ts(
                "Evicted /s",
                "Traces and sessions handed on before they were complete because a buffer limit was reached.",
                [
                    prom(
                        f"sum by (processor, reason) (rate(evalsi_traces_evicted_total{RATE}))",
                        "traces {{reason}}",
                    ),
                    prom(
                        f"sum by (processor, reason) (rate(evalsi_sessions_evicted_total{RATE}))",
                        "sessions {{reason}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Traces completed and evaluated /s",
                "Traces tail sampling completed, by why: quiet (decision_wait passed), max_trace_duration, evicted, "
                "shutdown; traces the evaluate processor looked at, left out (overload: shed), or whose scores no "
                "pipeline took.",
                [
                    prom(
                        f"sum by (reason) (rate(evalsi_tail_sampling_traces_completed_total{RATE}))",
                        "completed {{reason}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_traces_total{RATE}))", "evaluated by {{processor}}"
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_traces_shed_total{RATE}))",
                        "shed by {{processor}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_scores_dropped_total{RATE}))",
                        "scores dropped by {{processor}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Redaction /s",
                "Values masked per rule, attributes removed (not in allowed_keys), and failures by what on_error did.",
                [
                    prom(f"sum by (rule) (rate(evalsi_redaction_masked_total{RATE}))", "masked {{rule}}"),
                    prom(
                        f"sum by (processor) (rate(evalsi_redaction_removed_total{RATE}))",
                        "removed by {{processor}}",
                    ),
                    prom(
                        f"sum by (signal, action) (rate(evalsi_redaction_failures_total{RATE}))",
                        "failed {{signal}}: {{action}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_row(row("Pipeline workers (service.workers)"))
        .with_panel(
            single(
                "Worker restarts in the range",
                "Pipeline worker processes restarted after they died (evalsi_worker_restarts_total).",
                prom("sum(increase(evalsi_worker_restarts_total[$__range])) or vector(0)", instant=True),
                span=6,
                bad_above=1,
            )
        )
        .with_panel(
            single(
                "Requests lost with a worker",
                "Accepted requests a worker died holding (evalsi_worker_lost_requests_total), in the range.",
                prom("sum(increase(evalsi_worker_lost_requests_total[$__range])) or vector(0)", instant=True),
                span=6,
                bad_above=1,
            )
        )
        .with_panel(
            ts(
                "Spans decoded per worker /s",
                "How evenly the traces spread over the workers (evalsi_worker_spans_total); empty in one process.",
                [prom(f"sum by (worker) (rate(evalsi_worker_spans_total{RATE}))", "worker {{worker}}")],
                unit="cps",
            )
        )
        .with_row(row("Exporters and the store"))
        .with_panel(
            ts(
                "Store unavailable and write retries",
                "1 while the store refuses writes (evalsi_exporter_store_unavailable), and the writes retried, by "
                "reason (e.g. NOT_ENOUGH_SPACE).",
                [
                    prom("max by (exporter) (evalsi_exporter_store_unavailable)", "unavailable {{exporter}}"),
                    prom(
                        f"sum by (exporter, reason) (rate(evalsi_exporter_write_retries_total{RATE}))",
                        "retries {{exporter}} {{reason}}",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            ts(
                "Export failures /s",
                "Items exporters gave up on, scores dropped from a full queue, and unexpected errors of senders and "
                "background tasks (each logged, the task restarted).",
                [
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_log_records_total{RATE}))",
                        "log records {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_scores_total{RATE}))",
                        "scores {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(evalsi_exporter_send_failed_scores_total{RATE}))",
                        "scores {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_enqueue_failed_scores_total{RATE}))",
                        "scores, queue full {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(evalsi_exporter_sender_errors_total{RATE}))",
                        "sender errors {{exporter}}",
                    ),
                    prom(f"sum by (task) (rate(evalsi_task_failures_total{RATE}))", "task {{task}}"),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Scores written /s",
                "Scores each exporter delivered (evalsi_exporter_sent_scores_total: clickhouse, prometheus; "
                "otelcol_exporter_sent_scores_total: exporters that send to a backend).",
                [
                    prom(f"sum by (exporter) (rate(evalsi_exporter_sent_scores_total{RATE}))", "{{exporter}}"),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_sent_scores_total{RATE}))",
                        "{{exporter}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
    )
