"""Python files run as modules: config files (config/files.py), ablation tables (ablations) and
the user's task modules (tasks/pipeline.py)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def load(path: str, name: str, keep: bool = False) -> ModuleType:
    """Runs the file at ``path`` as a module named ``name`` and returns it.

    keep=True registers it in sys.modules (for files whose import has effects that must happen
    once per process, such as registering seqio tasks): a second call returns the first module,
    and a file that fails is not registered. keep=False runs it afresh each time."""
    if keep and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if keep:
        sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if keep:
            del sys.modules[name]
        raise
    return module
