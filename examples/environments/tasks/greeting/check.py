"""Grades the end state: prints one JSON verdict."""

import json
import os
from pathlib import Path

hello = Path(os.environ["EVALSI_WORKDIR"]) / "hello.txt"
ok = hello.exists() and hello.read_text().strip() == "Hello, Ada!"
print(json.dumps({"passed": ok, "score": 1.0 if ok else 0.0, "details": {"found": hello.exists()}}))
