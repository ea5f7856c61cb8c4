"""A compiler process for `t5lite compile --search`: every variant of a search compiles in a
child process, so a crash inside libtpu's compiler (libtpu 0.0.42.1 dies with SIGSEGV on
T5 v1.0 11B's fsdp 8 x tensor 8 mesh of v5p-128: a stack overflow in its convolution cost
model) costs that variant, not the search and the report of every variant before it.

The child stays up between variants (jax and libtpu load once; compile.py's cache of reports
lives there) and a new one starts after a crash. It is spawned, not forked: the parent may
already hold jax's threads.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import signal

from t5lite.errors import UserError


class CompilerCrashed(Exception):
    """The compiler's process died while compiling one variant (the message says how)."""


def _serve(conn, target: str) -> None:
    """Child: compile what arrives on conn until None; reply ("ok", report),
    ("user_error", message) or ("error", traceback text)."""
    import traceback
    module, name = target.split(":")
    compile_fn = getattr(importlib.import_module(module), name)
    while (job := conn.recv()) is not None:
        cfg, topo, hbm_bytes = job
        try:
            conn.send(("ok", compile_fn(cfg, topo, hbm_bytes=hbm_bytes)))
        except UserError as e:
            conn.send(("user_error", str(e)))
        except Exception:  # noqa: BLE001: any other failure goes back whole, as a traceback
            conn.send(("error", traceback.format_exc()))


_DEVICES: dict = {}


def compile_on_slice(cfg, topo, hbm_bytes: int = 0) -> dict:
    """compile.compile_step with the slice's abstract devices made once per topology."""
    from t5lite.mesh.topology import abstract_devices
    from t5lite.tpu.compile import compile_step
    if topo.jax_name not in _DEVICES:
        _DEVICES[topo.jax_name] = abstract_devices(topo)
    return compile_step(cfg, topo, _DEVICES[topo.jax_name], hbm_bytes)


def _how_it_died(exitcode) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


class CompilerProcess:
    """compile(cfg, topo, hbm_bytes) -> compile.compile_step's report, run in the child;
    UserError as the child raised it; CompilerCrashed when the child died doing it.
    ``target``: "module:function" the child compiles with (tests name one that crashes)."""

    def __init__(self, target: str = "t5lite.tpu.isolated:compile_on_slice"):
        self.target = target
        self._proc = None
        self._conn = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.target), daemon=True,
                                 name="t5lite-compiler")
        self._proc.start()
        child.close()

    def compile(self, cfg, topo, hbm_bytes: int = 0) -> dict:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((cfg, topo, hbm_bytes))
            kind, value = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(timeout=30)
            died = _how_it_died(self._proc.exitcode)
            self._proc = self._conn = None
            raise CompilerCrashed(f"the compiler's process died ({died})") from None
        if kind == "user_error":
            raise UserError(value)
        if kind == "error":
            raise RuntimeError(f"compiling in the compiler's process failed:\n{value}")
        return value

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        self._proc = self._conn = None


_SHARED: dict = {}


def shared() -> CompilerProcess:
    """One compiler process for this process's searches (its report cache serves them all)."""
    if "proc" not in _SHARED:
        _SHARED["proc"] = CompilerProcess()
        atexit.register(_SHARED["proc"].close)
    return _SHARED["proc"]
