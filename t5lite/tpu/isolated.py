"""A compiler process for `t5lite compile` and its --search: every variant of a search (and a
plain compile) compiles in a child process, so a crash inside libtpu's compiler (libtpu
0.0.42.1 dies with SIGSEGV on T5 v1.0 11B's fsdp 8 x tensor 8 mesh of v5p-128: a stack
overflow in its convolution cost model) costs that variant, not the search and the report of
every variant before it (or, for a plain compile, one line instead of libtpu's core dump).

The child stays up between variants (jax and libtpu load once; compile.py's cache of reports
lives there) and a new one starts after a crash. It is a fresh interpreter running this
module (`python -m t5lite.tpu.isolated`), not a multiprocessing child: those import the
caller's __main__ again, which a user's script without a main guard turns into a crash of
its own. Jobs arrive pickled on its stdin; replies leave on a pipe of their own (a library
that prints to stdout cannot corrupt them).
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import subprocess
import sys
import traceback

from t5lite.errors import UserError


class CompilerCrashed(Exception):
    """The compiler's process died while compiling one variant (the message says how)."""


def _serve(jobs, replies, target: str) -> None:
    """Child: compile what arrives on ``jobs`` until None or EOF; reply ("ok", report),
    ("user_error", message) or ("error", traceback text) on ``replies``."""
    module, name = target.split(":")
    compile_fn = getattr(importlib.import_module(module), name)
    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        if job is None:
            return
        cfg, topo, hbm_bytes = job
        try:
            reply = ("ok", compile_fn(cfg, topo, hbm_bytes=hbm_bytes))
        except UserError as e:
            reply = ("user_error", str(e))
        except Exception:  # noqa: BLE001: any other failure goes back whole, as a traceback
            reply = ("error", traceback.format_exc())
        pickle.dump(reply, replies)
        replies.flush()


_DEVICES: dict = {}


def _devices(topo):
    """The slice's abstract devices, made once per topology in this process."""
    from t5lite.mesh.topology import abstract_devices
    if topo.jax_name not in _DEVICES:
        _DEVICES[topo.jax_name] = abstract_devices(topo)
    return _DEVICES[topo.jax_name]


def compile_on_slice(cfg, topo, hbm_bytes: int = 0) -> dict:
    """compile.compile_step (`t5lite compile`, each variant of --search)."""
    from t5lite.tpu.compile import compile_step
    return compile_step(cfg, topo, _devices(topo), hbm_bytes)


def decode_on_slice(cfg, topo, hbm_bytes: int = 0) -> dict:
    """compile.compile_decode (`t5lite compile --decode`)."""
    from t5lite.tpu.compile import compile_decode
    return compile_decode(cfg, topo, _devices(topo), hbm_bytes)


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
        self._replies = None

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        # the child imports what this process can (a test's module, an uninstalled checkout)
        path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        env = dict(os.environ, PYTHONPATH=path)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "t5lite.tpu.isolated", self.target, str(write_fd),
             str(os.getpid())],
            stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb")

    def compile(self, cfg, topo, hbm_bytes: int = 0) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            pickle.dump((cfg, topo, hbm_bytes), self._proc.stdin)
            self._proc.stdin.flush()
            kind, value = pickle.load(self._replies)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            died = _how_it_died(self._proc.wait(timeout=60))
            self._replies.close()
            self._proc = self._replies = None
            raise CompilerCrashed(f"the compiler's process died ({died})") from None
        if kind == "user_error":
            raise UserError(value)
        if kind == "error":
            raise RuntimeError(f"compiling in the compiler's process failed:\n{value}")
        return value

    def close(self) -> None:
        if self._proc is not None:
            try:
                pickle.dump(None, self._proc.stdin)
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            self._replies.close()
        self._proc = self._replies = None


_SHARED: dict = {}
_PROGRAMS = {"train": "t5lite.tpu.isolated:compile_on_slice",
             "decode": "t5lite.tpu.isolated:decode_on_slice"}


def shared(program: str = "train") -> CompilerProcess:
    """One compiler process per program ("train": the train step, its report cache serving
    every search of this process; "decode": `t5lite compile --decode`'s program)."""
    if program not in _SHARED:
        _SHARED[program] = CompilerProcess(_PROGRAMS[program])
        atexit.register(_SHARED[program].close)
    return _SHARED[program]


def _die_with(parent_pid: int) -> None:
    """Child, on Linux: the kernel kills this process when its parent dies. A search stopped
    with SIGTERM or SIGKILL otherwise left the child compiling its variant (minutes and GBs
    of host memory for a large preset) for nobody; EOF on stdin is only seen between jobs.
    (The signal follows the parent's thread that started the child: a child started from a
    thread that ends goes with it, and the next compile() starts another.)"""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)


if __name__ == "__main__":  # the child: python -m t5lite.tpu.isolated TARGET REPLY_FD PARENT
    _die_with(int(sys.argv[3]))
    _serve(sys.stdin.buffer, os.fdopen(int(sys.argv[2]), "wb"), sys.argv[1])
