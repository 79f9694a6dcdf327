"""Which collector and store a run uses, and reading runs as a user does: `evalsi runs list` telling runs apart,
finding every run of the config's store whichever process recorded it, and answering while a run holds the store.
The real CLI in processes of its own, on embedded stores."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from running_collector import EVALSI, serve_config, start_collector, wait_until

from .test_run_e2e import run_file


def evalsi(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVALSI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def config_at(tmp: Path, store: Path, api: str = "127.0.0.1:0") -> Path:
    """An `evalsi.yaml` in `tmp` naming `store`, with its API endpoint at `api`."""
    cfg = serve_config(store)
    cfg["service"]["api"]["endpoint"] = api
    path = tmp / "evalsi.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def listed(tmp: Path, *args: str) -> list[dict[str, Any]]:
    res = evalsi("runs", "list", "--json", *args, cwd=tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_runs_list_tells_runs_apart_by_time_target_model_dataset_and_a_rescore_by_its_source(tmp_path: Path) -> None:
    config_at(tmp_path, tmp_path / "store")
    path = run_file(tmp_path, trials=1, gates=["metric('exact-match').mean >= 0.5"])
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["target"] = {"openai": {"base_url": "stub", "model": "stub-1"}}
    path.write_text(yaml.safe_dump(doc))
    for model in ("stub-1", "stub-2"):
        res = evalsi("run", "-f", str(path), "--model", model, "-q", cwd=tmp_path)
        assert res.returncode in (0, 1), res.stderr
    (first, *_) = [r["run_id"] for r in reversed(listed(tmp_path))]
    res = evalsi("rescore", "--run", first, "-f", str(path), cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr

    res = evalsi("runs", "list", cwd=tmp_path)

    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(line for line in lines if "run id" in line)
    for column in ("started (UTC)", "target", "model", "dataset", "tasks x trials", "headline", "gates"):
        assert column in header, header
    runs = listed(tmp_path)
    rows = {r["run_id"]: next(line for line in lines if line.startswith(f"│ {r['run_id']} ")) for r in runs}
    rescore = next(rows[r["run_id"]] for r in runs if r["manifest"].get("rescore"))
    by_model = {m: [line for line in rows.values() if f" {m} " in line and line != rescore]
                for m in ("stub-1", "stub-2")}  # fmt: skip
    assert len(by_model["stub-1"]) == 1 and len(by_model["stub-2"]) == 1, res.stdout
    for line in [*by_model["stub-1"], *by_model["stub-2"]]:
        assert "openai:" in line and "data.jsonl" in line and "3 x 1" in line, line
        assert "exact-match" in line and ("pass 1/1" in line or "FAIL 0/1" in line), line
        assert time.strftime("%Y-%m-%d", time.gmtime()) in line, line
    # the rescore names the run it re-scored and shows that run's tasks, dataset and model
    assert f"rescore of {first}" in rescore and "3 x 1" in rescore and "data.jsonl" in rescore, rescore
    assert "stub-1" in rescore, rescore


def test_a_run_ignores_a_collector_on_its_api_port_that_serves_another_store_and_says_where_it_went(
    tmp_path: Path,
) -> None:
    foreign_dir = tmp_path / "someone-else"
    foreign_dir.mkdir()
    foreign = start_collector(foreign_dir, serve_config(foreign_dir / "store"))
    try:
        mine = tmp_path / "mine"
        mine.mkdir()
        port = foreign.ready["api"].rpartition(":")[2]
        config_at(mine, mine / "store", api=f"127.0.0.1:{port}")  # someone else's collector answers here
        path = run_file(mine, trials=1, gates=[])

        res = evalsi("run", "-f", str(path), "-q", cwd=mine)

        assert res.returncode == 0, res.stderr
        said = [line for line in res.stderr.splitlines() if line.startswith("run capitals:")]
        assert len(said) == 1, res.stderr
        assert "in-process collector at http://127.0.0.1:" in said[0], said
        assert f"embedded store at {mine / 'store'}" in said[0], said
        assert httpx.get(foreign.api + "/api/v1/runs").json()["runs"] == []  # nothing went to the other store
        runs = listed(mine)
        assert [r["name"] for r in runs] == ["capitals"]
    finally:
        foreign.stop()


def test_a_run_goes_to_the_collector_serving_its_store_and_runs_list_reads_through_it(tmp_path: Path) -> None:
    served = start_collector(tmp_path, serve_config(tmp_path / "store"))  # its API on a port the config does not name
    try:
        path = run_file(tmp_path, trials=1, gates=[])

        res = evalsi("run", "-f", str(path), "-q", cwd=tmp_path)

        assert res.returncode == 0, res.stderr
        assert f"run capitals: collector at {served.api}, embedded store at {tmp_path / 'store'}" in res.stderr
        assert [r["name"] for r in httpx.get(served.api + "/api/v1/runs").json()["runs"]] == ["capitals"]
        assert [r["name"] for r in listed(tmp_path)] == ["capitals"]
    finally:
        served.stop()
    assert [r["name"] for r in listed(tmp_path)] == ["capitals"]  # and from the store itself once it stopped


def test_reading_commands_answer_while_a_run_holds_the_store(tmp_path: Path) -> None:
    config_at(tmp_path, tmp_path / "store")
    slow = [{"id": f"slow{i}", "input": "slow", "reference": "Rome"} for i in range(4)]  # 5 s each, one by one
    path = run_file(tmp_path, data=slow, trials=1, gates=[], concurrency=1)
    running = subprocess.Popen([*EVALSI, "run", "-f", str(path), "-q"], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert wait_until(lambda: (tmp_path / "store" / "status").exists(), timeout=120)  # the run holds the store
        # the store is open before the run's row is written in it: a busy machine can list nothing in between
        seen: list[list[dict[str, Any]]] = []
        assert wait_until(lambda: bool(seen.append(listed(tmp_path)) or seen[-1]), timeout=60)

        runs = seen[-1]
        show = evalsi("runs", "show", runs[0]["run_id"], cwd=tmp_path)
        traces = evalsi("traces", "list", cwd=tmp_path)

        assert [(r["name"], r["status"]) for r in runs] == [("capitals", "running")]
        assert show.returncode == 0 and runs[0]["run_id"] in show.stdout, show.stderr
        assert traces.returncode == 0, traces.stderr
    finally:
        _, err = running.communicate(timeout=240)
    assert running.returncode == 0, err
    # the run over, the store is read directly: still every run, now finished
    assert [(r["name"], r["status"]) for r in listed(tmp_path)] == [("capitals", "finished")]
