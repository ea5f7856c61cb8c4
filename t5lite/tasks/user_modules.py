"""The user's task modules (data.task_modules, `t5lite tasks --task-module`): imported once
each, what each registers noted, and the file each came from recorded with a run
("sha256:HEX /abs/path", data.task_module_files) so `t5lite eval` / `infer` import that same
file from any directory, and say so when it has changed since.

A mistake inside a module (a syntax error, a metric t5lite does not have, a task name that is
taken) is one UserError naming the module's file and line; a module that fails registers
nothing (what it had registered is removed, what it had replaced put back), so a corrected
import in the same process starts clean.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from typing import Sequence

import seqio

from t5lite.config import python_files
from t5lite.errors import UserError

# task or mixture name -> the module file that registered it (this process)
REGISTERED_BY: dict[str, str] = {}
_REGISTRIES = (seqio.TaskRegistry, seqio.MixtureRegistry)


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def record(path: str) -> str:
    """One data.task_module_files entry: "sha256:HEX /abs/path"."""
    return f"sha256:{file_sha256(path)} {path}"


def parse_record(entry: str) -> tuple[str, str]:
    """"sha256:HEX PATH" -> (HEX, PATH)."""
    digest, _, path = entry.partition(" ")
    return digest.removeprefix("sha256:"), path


def import_modules(entries: Sequence[str], saved: Sequence[str] = ()) -> tuple[str, ...]:
    """Import each data.task_modules entry (a module name importable from the current
    directory, or a path to a .py file) once per process. ``saved``: the run's
    data.task_module_files (one per entry, else unused): each entry is imported from the
    file recorded there, from any directory, with a warning line when its content changed.
    -> the records ("sha256:HEX PATH") of the files imported, one per entry."""
    saved = tuple(saved) if len(saved) == len(entries) else ()
    out = []
    for i, entry in enumerate(entries):
        path = _saved_file(entry, saved[i]) if saved else None
        path = path or resolve(entry)
        _import(entry, path)
        out.append(record(path))
    return tuple(out)


def _saved_file(entry: str, saved: str):
    """The file recorded for ``entry`` when the run was trained, if it is still there (a
    warning when its content changed, or when it is gone and the entry is looked up from the
    current directory instead)."""
    digest, path = parse_record(saved)
    if not os.path.isfile(path):
        print(f"t5lite: warning: data.task_modules {entry!r}: {path}, the file this run was "
              "trained with, is gone; importing it from the current directory instead",
              file=sys.stderr, flush=True)
        return None
    if file_sha256(path) != digest:
        print(f"t5lite: warning: {path} (data.task_modules {entry!r}) changed since this run "
              "was trained: its tasks may not be the ones the model learned", file=sys.stderr,
              flush=True)
    return path


def resolve(entry: str) -> str:
    """The absolute path of the file a data.task_modules entry names (a .py path, or a
    module name looked up from the current directory first)."""
    if entry.endswith(".py"):
        path = os.path.abspath(entry)
        if not os.path.isfile(path):
            raise UserError(f"data.task_modules: {entry} does not exist (looked for {path}). "
                            "Give a path to your .py file or a module name importable from "
                            "the current directory.")
        return path
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError) as e:
        spec, why = None, f" ({e})"
    else:
        why = ""
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise UserError(f"data.task_modules: cannot import {entry!r}{why}: no such module in "
                        f"{os.getcwd()} or on the Python path. Give a module importable from "
                        "the current directory or a path to a .py file.")
    return os.path.abspath(spec.origin)


def _import(entry: str, path: str) -> None:
    """Run the module (once per process) with the registries rolled back if it fails."""
    name = ("t5lite_user_tasks_" + os.path.splitext(os.path.basename(path))[0]
            if entry.endswith(".py") else entry)
    if name in sys.modules:
        return
    before = [{n: reg.get(n) for n in reg.names()} for reg in _REGISTRIES]
    try:
        if entry.endswith(".py"):
            python_files.load(path, name, keep=True)
        else:
            root = _import_root(entry, path)
            if root not in sys.path:
                sys.path.insert(0, root)
            importlib.import_module(entry)
        _check_replaced(before, path)
    except Exception as e:  # noqa: BLE001 - any mistake in the module: one line, file:line
        _roll_back(before)
        sys.modules.pop(name, None)
        if isinstance(e, UserError) and str(e).startswith(path):
            raise
        raise UserError(explain(e, entry, path, before)) from None
    for reg, old in zip(_REGISTRIES, before):
        for n in set(reg.names()) - set(old):
            REGISTERED_BY[n] = path


def _import_root(entry: str, path: str) -> str:
    """The sys.path folder from which ``entry`` (a dotted module name) is ``path``."""
    parts = entry.split(".")
    depth = len(parts) + (os.path.basename(path) == "__init__.py")
    root = path
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def _check_replaced(before, path: str) -> None:
    """registry.register_* replace a task of the same name silently (the built-ins re-register
    that way): from a user's module that is shadowing, refused like seqio's duplicates."""
    for reg, old in zip(_REGISTRIES, before):
        for n, provider in old.items():
            if n in reg.names() and reg.get(n) is not provider:
                raise UserError(f"{path}: {_taken(n)}")


def _roll_back(before) -> None:
    for reg, old in zip(_REGISTRIES, before):
        for n in list(reg.names()):
            if n not in old or reg.get(n) is not old[n]:
                reg.remove(n)
        for n, provider in old.items():
            if n not in reg.names():
                reg.add_provider(n, provider)


def _taken(name: str) -> str:
    owner = REGISTERED_BY.get(name)
    whose = (f"already registered by {owner}" if owner
             else "a t5lite built-in task or mixture (see `t5lite tasks list`)")
    return f"the task name {name!r} is {whose}; give your task another name."


def _line(e: BaseException, path: str) -> str:
    """"FILE:LINE" of the innermost frame of ``path`` in the exception's traceback."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    return f"{path}:{frames[-1].lineno}" if frames else path


def explain(e: Exception, entry: str, path: str, before) -> str:
    """One line for a mistake found while importing a task module."""
    where = _line(e, path)
    named = "" if entry.endswith(".py") else f" (data.task_modules {entry!r})"
    if isinstance(e, SyntaxError):
        return f"{where}: {e.msg}{named}: fix that line."
    if isinstance(e, UserError):
        return f"{where}: {e}"
    # metrics.NAME, or `from t5lite.tasks.metrics import NAME`, of a metric t5lite lacks
    missing = (e.name if isinstance(e, AttributeError) and getattr(e.obj, "__name__", "") ==
               "t5lite.tasks.metrics" else re.findall(r"cannot import name '([^']*)'", str(e))
               if isinstance(e, ImportError) and e.name == "t5lite.tasks.metrics" else None)
    if missing:
        from t5lite.tasks import metrics
        name = missing if isinstance(missing, str) else missing[0]
        return (f"{where}: t5lite.tasks.metrics has no {name!r}; its metrics are "
                f"{metrics.describe()}.")
    dup = re.match(r"Attempting to register duplicate provider: (\S+)", str(e))
    if isinstance(e, ValueError) and dup:
        name = dup.group(1)
        if not any(name in old for old in before):
            return f"{where}: the task name {name!r} is registered twice in {path}: rename one."
        return f"{where}: {_taken(name)}"
    if isinstance(e, ModuleNotFoundError) and e.name and not os.path.exists(path):
        return f"data.task_modules: cannot import {entry!r} ({e})."
    message = str(e).splitlines()[0] if str(e) else ""
    return f"{where}: {type(e).__name__}: {message}{named}: fix the module."
