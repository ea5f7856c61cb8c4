"""The layout rules of the code base (README "Layout"), checked on the source itself: imports form
no cycle, files and functions stay short enough to read in one sitting, the library never shells
out to its own CLI, and the model code reads no hidden process state."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("t5lite", "launch")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_LINE_CHARS = 100


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
        too_long += [f"{rel}:{i} {len(line)} characters" for i, line in
                     enumerate(text.splitlines(), 1) if len(line) > MAX_LINE_CHARS]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not _is_parser_builder(node):
                    too_long.append(f"{rel}:{node.lineno} {node.name}(): {n} lines")
    assert not too_long, "split these (lines, functions, files):\n" + "\n".join(too_long)


def test_test_files_are_short():
    """The suite's own files too (their lines may be longer: verbatim HLO and log text)."""
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _sources("tests", "bench")
                if (n := p.read_text().count("\n")) > MAX_FILE_LINES]
    assert not too_long, "split these files:\n" + "\n".join(too_long)


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


# The layers of t5lite, bottom to top (DESIGN.md "Layout"). A package (or top-level module)
# imports only from its own package and from lower layers, counting imports made inside
# functions; packages in one layer do not import each other. Importing t5lite.X also runs
# t5lite/__init__.py (the package face): it imports errors only.
LAYERS = (
    ("t5lite.errors", "t5lite.text_table", "t5lite.progress", "t5lite.clock"),  # no t5lite import
    ("t5lite",),  # the face: UserError
    ("t5lite.config", "t5lite.task_catalog"),
    ("t5lite.mesh",),  # the chip table, meshes and sharding rules, compiler options
    ("t5lite.models", "t5lite.dataprep"),
    ("t5lite.tasks", "t5lite.store"),
    ("t5lite.monitor", "t5lite.peft", "t5lite.convert"),
    ("t5lite.eval",),
    ("t5lite.train", "t5lite.decoding"),  # decoding: README's old path to eval.decoding
    ("t5lite.tpu",),
    ("t5lite.ablations",),
    ("t5lite.cli",),
)

# Known exceptions, each (importer package, imported package): reason. Empty: every package
# import in t5lite runs downward.
ALLOWED_UPWARD = {}


def _package(module: str) -> str:
    """t5lite.train.loop -> t5lite.train; t5lite.errors -> t5lite.errors; t5lite -> t5lite."""
    return ".".join(module.split(".")[:2])


def _import_sites(path: pathlib.Path, known: set):
    """(line, imported t5lite module) of every import in ``path``, module level or inside a
    function (not under ``if TYPE_CHECKING:``). ``from t5lite import config`` imports
    t5lite.config (the face only for a name that is not a module)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [n for n in subs if n in known]
            if len(names) < len(subs):
                names.append(node.module)
        else:
            continue
        for name in names:
            while name not in known and "." in name:  # import t5lite.x.y.z as attribute
                name = name.rsplit(".", 1)[0]
            if name in known:
                yield node.lineno, name


def _package_edges() -> dict:
    """(importer package, imported package) -> ["module:line -> module", ...]."""
    paths = {_module_name(p): p for p in _sources("t5lite")}
    edges = {}
    for name, path in sorted(paths.items()):
        for line, imported in _import_sites(path, set(paths)):
            a, b = _package(name), _package(imported)
            if a != b:
                edges.setdefault((a, b), []).append(f"{name}:{line} -> {imported}")
    return edges


def _strongly_connected(graph: dict) -> list:
    """The components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_layer():
    layered = [p for layer in LAYERS for p in layer]
    assert len(layered) == len(set(layered)), "a package in two layers"
    packages = {_package(_module_name(p)) for p in _sources("t5lite")}
    assert packages == set(layered), (
        f"put these in LAYERS: {sorted(packages - set(layered))}; "
        f"gone: {sorted(set(layered) - packages)}")


def test_packages_import_only_downward():
    """Counting imports inside functions: a deferred import is a dependency all the same."""
    level = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    edges = _package_edges()
    wrong = [f"{a} -> {b} ({'sideways' if level[a] == level[b] else 'upward'}): "
             + ", ".join(sites)
             for (a, b), sites in sorted(edges.items())
             if level[a] <= level[b] and (a, b) not in ALLOWED_UPWARD]
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    tangles = _strongly_connected(graph)
    assert not wrong, ("move the shared piece below both, or pass it in:\n" + "\n".join(wrong)
                       + f"\npackages in one loop: {tangles}")
    stale = [e for e in ALLOWED_UPWARD if e not in edges]
    assert not stale, f"no longer imported: drop from ALLOWED_UPWARD: {stale}"


def test_package_graph_has_no_cycle():
    graph = {}
    for a, b in _package_edges():
        graph.setdefault(a, set()).add(b)
    assert _find_cycle(graph) is None and not _strongly_connected(graph), (
        f"package import cycle {_find_cycle(graph)}; tangles: {_strongly_connected(graph)}")


def test_scc_finder():
    assert _strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert _strongly_connected({"a": {"b"}}) == []


def _import_time_nodes(tree: ast.Module):
    """Nodes that run when the module is imported: all but the bodies of functions."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _changes_environment(node) -> bool:
    def is_environ(n):
        return ast.unparse(n) in ("os.environ", "environ")
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        return any(isinstance(t, ast.Subscript) and is_environ(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        return ((is_environ(f.value) and f.attr in ("setdefault", "update", "pop", "clear"))
                or ast.unparse(f) in ("os.putenv", "os.unsetenv")
                or f.attr == "configure")  # gcs.configure(): the entry points call it
    return False


def test_importing_a_module_changes_no_environment():
    """No import-time side effects: no module writes os.environ (or routes gs://) as it is
    imported; the CLI and the functions that need a setting make it."""
    offenders = []
    for path in _sources("t5lite"):
        for node in _import_time_nodes(ast.parse(path.read_text())):
            if _changes_environment(node):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders


def test_import_t5lite_leaves_os_environ_unchanged():
    code = ("import json, os; before = dict(os.environ)\n"
            "import t5lite, t5lite.store, t5lite.store.gcs, t5lite.store.paths, t5lite.config\n"
            "import fsspec.config\n"
            "print(json.dumps([k for k in set(before) | set(os.environ)"
            " if before.get(k) != os.environ.get(k)] + list(fsspec.config.conf)))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("EPATH_USE_TF", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
                        "TENSORSTORE_GCS_HTTP_URL")}
    env.update(STORAGE_EMULATOR_HOST="localhost:1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


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
