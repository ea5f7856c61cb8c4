"""`t5lite compile --search`'s space (t5lite/tpu/search.py): meshes x remat policies x
collective matmuls on / off x micro-batch counts, ranked by expected step. The compiles are
stood in for here (tests/test_compile.py compiles a real search): what is tried, and what wins."""

from t5lite import config as config_lib
from t5lite.mesh import topology
from t5lite.tpu import search


def _fake_compile(cfg, topo, devices=None, hbm_bytes=0):
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
    monkeypatch.setattr(search, "compile_step", _fake_compile)
    monkeypatch.setattr(search, "abstract_devices", lambda topo: [])
    cfg = config_lib.load_config("gpt2_tiny", ["data.batch_size=64"])
    res = search.search(cfg, topology.parse_topology("v5litepod-4"), log=lambda s: None,
                        max_accum=4)
    tried = [r for r in res["tried"] if "fits" in r]
    by_mesh = {}
    for r in tried:
        by_mesh.setdefault(r["mesh"], set()).add((r["remat"], r["collective_matmul"],
                                                   r["grad_accum_steps"]))
    # weights sharded (fsdp or tensor > 1): every remat with collective matmuls off and on;
    # pure data parallelism has none to turn on
    assert by_mesh[(1, 4, 1)] == {(p, cm, a) for p in search.REMATS for cm in (False, True)
                                  for a in (1, 2)}
    assert by_mesh[(4, 1, 1)] == {(p, False, a) for p in search.REMATS for a in (1, 2)}
    assert by_mesh[(1, 1, 4)] >= {("none", True, 2)}
    # micro-batches: one did not fit, two did, four were never needed
    assert not any(r["grad_accum_steps"] == 4 for r in tried)
    best = res["best"]
    assert (best["mesh"], best["remat"], best["collective_matmul"]) == ((1, 4, 1), "none", True)
    assert {"mesh.collective_matmul=True", "train.grad_accum_steps=2"} <= set(best["set"])
    steps = [r["expected_step_seconds"] for r in res["candidates"]]
    assert steps == sorted(steps) and all(r["fits"] for r in res["candidates"])
