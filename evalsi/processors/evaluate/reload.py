"""Policy reload (SIGHUP): the policy files loaded again and swapped in on the engine thread, between two works;
on any error the policies in use stay. Its metric: `evalsi_policy_reloads`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evalsi.component import Settings
from evalsi.evaluators.judge_client import Judges
from evalsi.policies.baseline import Baselines
from evalsi.processors.evaluate.config import EvaluateConfig, load_policy_set
from evalsi.processors.evaluate.work_queue import EvaluationQueue


class PolicyReload:
    def __init__(self, settings: Settings, judges: Judges, queue: EvaluationQueue, baselines: Baselines) -> None:
        self.settings = settings
        self.baselines = baselines
        self.judges = judges
        self.queue = queue
        self._reloads = settings.metrics.counter(
            "evalsi_policy_reloads",
            "Policy reloads (SIGHUP), by result: ok, or failed (the old policies stay).",
            ["processor", "result"],
        )

    async def __call__(
        self, config: EvaluateConfig, policies: list[str] | None, base_dir: Path | None
    ) -> tuple[EvaluateConfig, str]:
        """Load `policies` (else `config`'s files again) and swap them in; policies whose window is unchanged keep
        it. Returns the config now in use and what changed, for the log; raises `ValueError` naming the file."""
        if policies is not None:
            fresh_config = config.model_copy(update={"policies": policies})
            fresh_config._base_dir = base_dir if base_dir is not None else config._base_dir
            config = fresh_config
        try:
            fresh = await asyncio.get_running_loop().run_in_executor(None, load_policy_set, config, self.judges)
        except ValueError:
            self._reloads.labels(self.settings.id, "failed").inc()
            raise
        fresh.negative_below = config.late_signals.negative_below
        fresh.use_baselines(self.baselines)
        if self.settings.worker is not None:
            fresh.record_windows()  # the collector process's windows aggregate every worker's

        def swap() -> list[str]:
            kept = fresh.carry_over(self.queue.policies)
            self.queue.use(fresh)
            return kept

        old = {p.name for p in self.queue.policies.policies}
        kept = await self.queue.on_engine(swap)
        new = {p.name for p in fresh.policies}
        self._reloads.labels(self.settings.id, "ok").inc()
        return config, (
            f"{len(new)} policies ({', '.join(sorted(new)) or 'none'}); added {sorted(new - old)}, removed "
            f"{sorted(old - new)}, windows kept {sorted(kept)}"
        )
