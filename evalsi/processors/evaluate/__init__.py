"""The `evaluate` processor: runs the online policies over every completed trace and session, hands on the scores,
and gives policies that read `feedback` a second look at a recent trace when human or external scores arrive late.

It needs whole traces, so it sits after `tail_sampling` (which hands on `BatchKind.TRACE` batches whatever its storage
decision); spans pass through unchanged to the exporters, scores go to the `scores` pipeline. Listed in the `scores`
pipeline too, it sees the feedback that flows there (`POST /v1/feedback`).

The package, one job a module:
- `processor`: `Evaluate`, the facade the pipeline and the pipeline workers talk to;
- `config`: `EvaluateConfig` and loading its policy files;
- `work_queue`: the evaluation queue, the engine thread, handing the scores on;
- `late_feedback`: the buffers of recent traces and early feedback (by project and trace id);
- `duplicate_calls`: a model call recorded in two traces, joined to be evaluated once;
- `sessions`: with workers, sessions assembled from every worker's traces;
- `alerts`: the policies' alerts to the log, the metrics, the notifier and the store;
- `reload`: policy files loaded again on SIGHUP;
- `events`: `gen_ai.evaluation.result` log records as external scores.
"""

from evalsi.processors.evaluate.config import DuplicateCallsConfig, EvaluateConfig, LateSignalsConfig
from evalsi.processors.evaluate.events import EVALUATION_EVENT, score_from_event
from evalsi.processors.evaluate.processor import Evaluate
from evalsi.processors.evaluate.work_queue import Work, WorkUnit

__all__ = [
    "EVALUATION_EVENT", "DuplicateCallsConfig", "Evaluate", "EvaluateConfig", "LateSignalsConfig", "Work", "WorkUnit",
    "score_from_event",
]  # fmt: skip
