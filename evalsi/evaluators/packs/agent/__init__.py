"""The `agent` pack: an agent's run judged from its trajectory (`evalsi/model/trajectory.py`) and spans; importing it
registers every `builtin/*` agent evaluator.

`tools` judges tool calls one by one, `efficiency` how much the agent did, `reference` the run against an
expected trajectory or expected actions, `task_success` the task's outcome; `calls` is what they all read.
"""

from evalsi.evaluators.packs.agent import (
    efficiency,  # noqa: F401
    reference,  # noqa: F401
    task_success,  # noqa: F401
    tools,  # noqa: F401
)
