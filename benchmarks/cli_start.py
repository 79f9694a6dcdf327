"""How fast the `evalsi` command starts: `evalsi --help`, `evalsi validate -c <small config>` and
`evalsi traces list --api <url>` against a collector this script starts, each against `python -c pass` measured in
the same run (interleaved rounds, best of N).

    .venv/bin/python benchmarks/cli_start.py --runs 10

Prints, per command, the best and the median wall time, and the best as a multiple of the best `python -c pass`.
Exit 1 when a command fails. Another tree can be measured the same way: `PYTHONPATH=<its root>` (the console script
then imports that tree's `evalsi`; the first line printed says which).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _config(store: Path) -> dict[str, Any]:
    """A small config: every listener on port 0 (the collector's ready line says where), the embedded store."""
    return {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
        },
        "processors": {"normalize": {}},
        "exporters": {"clickhouse": {"endpoint": f"chdb://{store}"}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]},
            },
            "api": {"endpoint": "127.0.0.1:0"},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}, "logs": {"encoding": "json"}},
            "workers": 1,
        },
    }


def _start(evalsi: str, config: Path, log: Path, timeout: float = 120) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("wb") as out:
        proc = subprocess.Popen([evalsi, "serve", "-c", str(config)], stdout=out, stderr=out, cwd=config.parent)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") == "ready":
                return proc, "http://" + entry["api"]
        if proc.poll() is not None:
            raise SystemExit(f"evalsi serve exited {proc.returncode}:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"evalsi serve not ready in {timeout} s:\n{log.read_text(errors='replace')}")


def _once(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, cwd=cwd)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr.decode(errors='replace')}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="rounds; each runs every command once (default 10)")
    parser.add_argument("--evalsi", default=str(Path(sys.executable).with_name("evalsi")), help="the console script")
    args = parser.parse_args()

    where = subprocess.run(
        [sys.executable, "-c", "import evalsi.cli; print(evalsi.cli.__file__)"], capture_output=True, text=True, cwd="/"
    ).stdout.strip()
    print(f"evalsi.cli from {where}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory(prefix="evalsi-cli-start-") as tmp:
        root = Path(tmp)
        config = root / "evalsi.yaml"
        config.write_text(json.dumps(_config(root / "store"), indent=2))  # JSON is YAML
        work = root / "work"  # no ./evalsi.yaml here: each command reads what it is given
        work.mkdir()
        proc, api = _start(args.evalsi, config, root / "serve.log")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "evalsi --help": [args.evalsi, "--help"],
            "evalsi validate -c <small config>": [args.evalsi, "validate", "-c", str(config)],
            "evalsi traces list --api <url>": [args.evalsi, "traces", "list", "--api", api],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        try:
            for cmd in commands.values():
                _once(cmd, work)  # warm: bytecode caches, the page cache
            for _ in range(args.runs):
                for name, cmd in commands.items():
                    times[name].append(_once(cmd, work))
        finally:
            proc.terminate()
            proc.wait(60)
    base = min(times["python -c pass"])
    print(f"best of {args.runs} (interleaved), load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'command':36} {'best s':>8} {'median s':>9} {'x pass':>7}")
    for name, took in times.items():
        print(f"{name:36} {min(took):8.3f} {statistics.median(took):9.3f} {min(took) / base:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
