"""`t5lite compile --search`'s space (t5lite/tpu/search.py): meshes x remat policies x
collective matmuls on / off x micro-batch counts, ranked by expected step. The compiles are
stood in for here (tests/test_compile.py compiles a real search): what is tried, and what wins,
and that a compiler process that dies on one variant (as libtpu's does on some meshes) costs that
variant only."""

import os
import signal
import subprocess
import sys
import time

import pytest

from t5lite import config as config_lib
from t5lite.cli import main as cli
from t5lite.errors import UserError
from t5lite.mesh import topology
from t5lite.tpu import isolated, search


def _fake_compile(cfg, topo, hbm_bytes=0):
    """A report whose step is faster with collective matmuls on an fsdp mesh and with less
    remat, and that fits only from two micro-batches on."""
    m = cfg.mesh
    seconds = 1.0 + {"none": 0.0, "minimal": 0.1, "full": 0.2}[cfg.model.remat]
    seconds -= 0.3 if m.collective_matmul and m.fsdp > 1 else 0.0
    seconds += 0.01 * m.data
    fits = cfg.train.grad_accum_steps >= 2
    return {"compiled": True, "fits": fits, "remat": cfg.model.remat,
            "collective_matmul": m.collective_matmul, "mesh": (m.data, m.fsdp, m.tensor),
            "grad_accum_steps": cfg.train.grad_accum_steps,
            "bytes_per_chip": {"total": 2 ** 30}, "expected_step_seconds": seconds}


def test_search_tries_collective_matmuls_and_micro_batches(monkeypatch):
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=lambda s: None,
                        max_accum=4, compile_fn=_fake_compile)
    tried = [r for r in res["tried"] if "fits" in r]
    by_mesh = {}
    for r in tried:
        by_mesh.setdefault(r["mesh"], set()).add((r["remat"], r["collective_matmul"],
                                                   r["grad_accum_steps"]))
    # weights sharded (fsdp or tensor > 1): every remat with collective matmuls off and on;
    # pure data parallelism has none to turn on
    # at each micro-batch count remat full first: with one micro-batch it did not fit, so the
    # policies that save more activations were not compiled there
    assert by_mesh[(1, 4, 1)] == ({("full", cm, 1) for cm in (False, True)}
                                  | {(p, cm, 2) for p in search.REMATS for cm in (False, True)})
    assert by_mesh[(4, 1, 1)] == {("full", False, 1)} | {(p, False, 2) for p in search.REMATS}
    assert by_mesh[(1, 1, 4)] >= {("none", True, 2)}
    # micro-batches: one did not fit, two did, four were never needed
    assert not any(r["grad_accum_steps"] == 4 for r in tried)
    best = res["best"]
    assert (best["mesh"], best["remat"], best["collective_matmul"]) == ((1, 4, 1), "none", True)
    assert {"mesh.collective_matmul=True", "train.grad_accum_steps=2"} <= set(best["set"])
    steps = [r["expected_step_seconds"] for r in res["candidates"]]
    assert steps == sorted(steps) and all(r["fits"] for r in res["candidates"])


def _dies_on_one_variant(cfg, topo, hbm_bytes=0):
    """The compiler process's function in the next test: the fake compile, except that one
    variant kills its process with SIGSEGV, as libtpu 0.0.42.1 does on 11B's 8 x 8 mesh."""
    m = cfg.mesh
    if (m.data, m.fsdp, m.tensor, cfg.model.remat, m.collective_matmul,
            cfg.train.grad_accum_steps) == (1, 2, 2, "minimal", False, 2):
        os.kill(os.getpid(), signal.SIGSEGV)
    return dict(_fake_compile(cfg, topo, hbm_bytes), pid=os.getpid())


def test_a_variant_that_kills_the_compiler_is_recorded_and_the_search_goes_on():
    proc = isolated.CompilerProcess(target=f"{__name__}:_dies_on_one_variant")
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    logged = []
    try:
        res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=logged.append,
                            max_accum=2, compile_fn=proc.compile)
    finally:
        proc.close()
    crashed = res["crashed"]
    assert [c["set"] for c in crashed] == [
        ["mesh.data=1", "mesh.fsdp=2", "mesh.tensor=2", "model.remat=minimal",
         "mesh.collective_matmul=False", "train.grad_accum_steps=2"]], crashed
    assert "SIGSEGV" in crashed[0]["crashed"]
    assert any("CRASHED" in line and "SIGSEGV" in line for line in logged), logged
    # the variants after it on the same mesh, and the meshes after it, were compiled by a
    # new compiler process
    after = [r for r in res["tried"] if "fits" in r and r["mesh"] == (1, 2, 2)]
    assert {(r["remat"], r["collective_matmul"]) for r in after} >= {("minimal", True),
                                                                    ("full", False)}
    pids = [r["pid"] for r in res["tried"] if "pid" in r]
    assert len(set(pids)) == 2 and pids[0] != os.getpid(), pids
    assert res["best"] is not None and res["why_none"] == ""


def test_when_every_variant_crashes_the_search_says_so():
    def crash(cfg, topo, hbm_bytes=0):
        raise isolated.CompilerCrashed("the compiler's process died (killed by SIGSEGV)")
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=lambda s: None,
                        max_accum=1, compile_fn=crash)
    assert res["best"] is None and len(res["crashed"]) == len(res["tried"]) > 1
    assert res["why_none"].startswith("every variant tried on v5litepod-4 crashed the compiler")
    assert "SIGSEGV" in res["why_none"], res["why_none"]


def test_a_mesh_where_remat_full_never_fits_costs_its_two_variants_a_micro_batch_count():
    def fits_only_tensor_parallel(cfg, topo, hbm_bytes=0):
        return dict(_fake_compile(cfg, topo, hbm_bytes),
                    fits=cfg.mesh.tensor == 4 and cfg.train.grad_accum_steps >= 2)
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=lambda s: None,
                        max_accum=4, compile_fn=fits_only_tensor_parallel)
    on = {}
    for r in res["tried"]:
        on.setdefault(r["mesh"], []).append((r["remat"], r["collective_matmul"],
                                             r["grad_accum_steps"]))
    assert sorted(on[(1, 4, 1)]) == sorted((("full", cm, a) for cm in (False, True)
                                            for a in (1, 2, 4)))
    assert sorted(on[(4, 1, 1)]) == [("full", False, a) for a in (1, 2, 4)]
    assert {(r["remat"], r["collective_matmul"]) for r in res["candidates"]} == {
        (p, cm) for p in search.REMATS for cm in (False, True)}
    assert all(r["mesh"] == (1, 1, 4) and r["grad_accum_steps"] == 2
               for r in res["candidates"])


def _needs_micro_batches(slow_none=False):
    """Remat full fits with one micro-batch, minimal from two, none from four; each extra
    micro-batch costs 0.05 s, so none with four is the fastest fit (or, with slow_none, none
    is already slower than full with two)."""
    def compile_fn(cfg, topo, hbm_bytes=0):
        remat, accum = cfg.model.remat, cfg.train.grad_accum_steps
        seconds = {"none": 2.0 if slow_none else 1.0, "minimal": 1.15, "full": 1.3}[remat]
        return dict(_fake_compile(cfg, topo, hbm_bytes),
                    fits=accum >= {"full": 1, "minimal": 2, "none": 4}[remat],
                    expected_step_seconds=seconds + 0.05 * accum)
    return compile_fn


def _tried_on(res):
    return sorted((r["remat"], r["collective_matmul"], r["grad_accum_steps"])
                  for r in res["tried"])


def test_each_remat_policy_is_ranked_at_the_fewest_micro_batches_it_fits_with():
    """Remat none with four micro-batches against full with one: each policy counts on from
    where the one saving fewer activations fit, and all three are ranked."""
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=lambda s: None,
                        max_accum=8, compile_fn=_needs_micro_batches(), fixed={"fsdp": 4})
    assert _tried_on(res) == sorted(
        [("full", cm, 1) for cm in (False, True)]
        + [("minimal", cm, a) for cm in (False, True) for a in (1, 2)]
        + [("none", cm, a) for cm in (False, True) for a in (2, 4)])
    ranked = [(r["remat"], r["grad_accum_steps"]) for r in res["candidates"]]
    assert ranked[::2] == [("none", 4), ("minimal", 2), ("full", 1)], ranked
    assert "train.grad_accum_steps=4" in res["best"]["set"]


def test_a_policy_already_slower_than_the_mesh_fastest_fit_gets_no_more_micro_batches():
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    logged = []
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=logged.append,
                        max_accum=8, compile_fn=_needs_micro_batches(slow_none=True),
                        fixed={"fsdp": 4})
    assert ("none", False, 4) not in _tried_on(res)
    assert [r for r in _tried_on(res) if r[0] == "none"] == [("none", cm, 2)
                                                            for cm in (False, True)]
    assert any("remat none does not fit with 2 micro-batches and is already slower" in line
               for line in logged), logged
    assert (res["best"]["remat"], res["best"]["grad_accum_steps"]) == ("minimal", 2)


def _always_dies(cfg, topo, hbm_bytes=0):
    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_plain_compile_that_kills_the_compiler_is_one_line(monkeypatch, capsys):
    """`t5lite compile` without --search compiles in the same kept compiler process: a libtpu
    crash (T5 v1.0 base with remat minimal on v5p-8) ends in one line, not this process."""
    proc = isolated.CompilerProcess(target=f"{__name__}:_always_dies")
    monkeypatch.setitem(isolated._SHARED, "train", proc)
    try:
        rc = cli.main(["compile", "--config", "gpt2_tiny", "--topology", "v5litepod-4"])
    finally:
        proc.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "SIGSEGV" in err[0] and "v5litepod-4" in err[0] and "--search" in err[0], err


def test_a_decode_compile_that_kills_the_compiler_is_one_line(monkeypatch, capsys):
    """--decode compiles in a compiler process of its own too (it ran in this one before, so
    a libtpu crash ended the command with a core dump)."""
    assert isolated._PROGRAMS["decode"].endswith(":decode_on_slice")
    proc = isolated.CompilerProcess(target=f"{__name__}:_always_dies")
    monkeypatch.setitem(isolated._SHARED, "decode", proc)
    try:
        rc = cli.main(["compile", "--config", "gpt2_tiny", "--topology", "v5litepod-4",
                       "--decode"])
    finally:
        proc.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "SIGSEGV" in err[0] and "decode program for v5litepod-4" in err[0], err


def test_a_mesh_axis_given_with_set_is_held_by_the_search(capsys):
    from t5lite.cli import commands
    assert commands._fixed_mesh_axes(["mesh.tensor=4", "mesh.fsdp=-1", "model.remat=full",
                                      " mesh.data = 2"]) == {"tensor": 4, "data": 2}
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-8"), log=lambda s: None,
                        max_accum=2, compile_fn=_fake_compile, fixed={"tensor": 4})
    assert {r["mesh"] for r in res["tried"]} == {(1, 2, 4), (2, 1, 4)}
    with pytest.raises(UserError, match="no mesh of 8 chips that --search tries has "
                                        "mesh.tensor=16"):
        search.search(cfg, topology.parse_topology("v5litepod-8"), log=lambda s: None,
                      compile_fn=_fake_compile, fixed={"tensor": 16})


def _sleeps(cfg, topo, hbm_bytes=0):
    time.sleep(120)


PARENT = """import os, pickle, signal, sys
sys.path.insert(0, {tests!r})
from t5lite.tpu import isolated
proc = isolated.CompilerProcess(target="test_tpu_search:_sleeps")
proc._start()
pickle.dump((None, None, 0), proc._proc.stdin)
proc._proc.stdin.flush()
print(proc._proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_compiler_process_dies_with_the_process_that_started_it():
    """A search stopped with SIGKILL (or SIGTERM) takes its compiler with it, mid-compile."""
    tests = os.path.dirname(os.path.abspath(__file__))
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(tests=tests)],
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())  # (the child holds the pipe open while it lives)
    assert parent.wait(timeout=60) == -signal.SIGKILL
    parent.stdout.close()
    deadline = time.time() + 30
    while _alive(child) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(child), f"compiler process {child} outlived its parent"
