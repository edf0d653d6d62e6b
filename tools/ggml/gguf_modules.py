"""gguf's modules without gguf/__init__.py, which imports yaml, requests and tqdm: the
package is replaced by a stub holding only its path, so `gguf.<name>` imports the one file
(and what it imports relatively). Used by tools/ggml/gguf_vectors.py (PyPI's gguf) and
adapters/llama/gguf_model.py (the gguf-py vendored in the pinned llama.cpp)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def gguf_modules(*names: str):
    """The modules gguf.<name> for each name, in order."""
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no gguf package on this interpreter's path (PyPI's gguf, or PYTHONPATH=<gguf-py>)")
    package = types.ModuleType("gguf")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["gguf"] = package
    return tuple(importlib.import_module(f"gguf.{n}") for n in names)
