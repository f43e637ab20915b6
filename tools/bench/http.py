#!/usr/bin/env python3
"""HTTP, MCP and streaming benchmark: ``tools/bench/http.py [--json OUT.json] …``.

The benchmark itself is ``http_bench.py`` beside this file (method, flags and
figures there and in docs/benchmarks.md); this entry point keeps the name.

A file named ``http.py`` shadows the standard library's ``http`` package for
every script of this directory (Python puts a script's directory first on
``sys.path``). So, imported as ``http`` by a sibling (``footprint.py`` →
Ray → ``http.client``), this module hands the importer the standard library's
package instead of itself.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

HERE = os.path.dirname(os.path.realpath(__file__))


def _outside() -> list[str]:
    return [p for p in sys.path if os.path.realpath(p or os.curdir) != HERE]


if __name__ == "__main__":
    sys.path[:] = _outside()
    runpy.run_path(os.path.join(HERE, "http_bench.py"), run_name="__main__")
else:
    _saved = sys.path[:]
    sys.path[:] = _outside()
    try:
        del sys.modules[__name__]
        sys.modules[__name__] = importlib.import_module(__name__)
    finally:
        sys.path[:] = _saved
