"""The layout rules of the code base (README "Layout"), checked on the source itself: imports form
no cycle, files and functions stay short enough to read in one sitting, the library never shells
out to its own CLI, and the model code reads no hidden process state."""

from __future__ import annotations

import ast
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("t5lite", "launch")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def _sources(*roots: str):
    for root in roots:
        yield from sorted((ROOT / root).rglob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_parser_builder(node: ast.FunctionDef) -> bool:
    """argparse parser builders are long lists of add_argument calls: exempt, as agreed."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]
    return len(calls) >= 10


def test_files_and_functions_are_short():
    too_long = []
    for path in _sources(*PACKAGES):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if text.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not _is_parser_builder(node):
                    too_long.append(f"{rel}:{node.lineno} {node.name}(): {n} lines")
    assert not too_long, "split these:\n" + "\n".join(too_long)


def _type_checking_only(tree: ast.Module) -> set:
    """Import nodes under `if TYPE_CHECKING:` (never executed)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _imports(path: pathlib.Path, known: set) -> set:
    """t5lite modules `path` imports (module level and inside functions alike)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def _import_graph() -> dict:
    paths = {_module_name(p): p for p in _sources("t5lite")}
    known = set(paths)
    graph = {}
    for name, path in paths.items():
        # a package's __init__ re-exporting its own modules is not a cycle with them
        graph[name] = {m for m in _imports(path, known) if m != name
                       and not (path.name == "__init__.py" and m.startswith(name + "."))}
    return graph


def _find_cycle(graph: dict):
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_imports_form_no_cycle():
    graph = _import_graph()
    # importing a submodule runs its package's __init__: a module importing its own package's
    # face is a dependency on everything that face imports
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_library_never_runs_its_own_cli_as_a_subprocess():
    offenders = []
    for path in _sources("t5lite"):
        text = path.read_text()
        if '"t5lite.cli"' in text or "'t5lite.cli'" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"call the Python API instead of `python -m t5lite.cli`: {offenders}"


def test_model_code_reads_no_contextvar_or_process_global():
    """Backend choices reach the model as config fields, not as hidden state."""
    offenders = []
    for path in _sources(os.path.join("t5lite", "models")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                offenders.append(f"{path.name}:{node.lineno} global {node.names}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                if "contextvars" in mods:
                    offenders.append(f"{path.name}:{node.lineno} imports contextvars")
    assert not offenders, offenders
