"""Keeps pandas out of evalsi's processes: pyarrow and chDB import it, when it is installed (chDB requires it), to
check whether what they are handed is a pandas object. evalsi hands them none, and pandas costs ~45 MB of RSS in the
collector and in every pipeline worker."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.abc import MetaPathFinder
from typing import Any


class _PandasFinder(MetaPathFinder):
    """First on `sys.meta_path`: fails `import pandas` in a thread inside `pandas_hidden`, passes everything else on.
    (A `None` in `sys.modules` would not do: pyarrow's compiled import takes whatever `sys.modules` holds.)"""

    def __init__(self) -> None:
        self.hiding = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if getattr(self.hiding, "depth", 0) and fullname.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden from pyarrow and chDB)", name=fullname)
        return None


_FINDER = _PandasFinder()
_INSTALL = threading.Lock()


@contextmanager
def pandas_hidden() -> Iterator[None]:
    """Within: `import pandas` fails in this thread, as if pandas were not installed; other threads import it as
    usual, and once pandas is loaded this hides nothing."""
    if _FINDER not in sys.meta_path:
        with _INSTALL:
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
    hiding = _FINDER.hiding
    hiding.depth = getattr(hiding, "depth", 0) + 1
    try:
        yield
    finally:
        hiding.depth -= 1
