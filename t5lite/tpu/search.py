"""`t5lite compile --search`: meshes x remat policies x micro-batch counts compiled for a
slice, the fitting ones ranked by expected step time (step_time.py)."""

from __future__ import annotations

import itertools
import math

from t5lite.errors import UserError
from t5lite.tpu.compile import compile_step
from t5lite.tpu.topology import GiB, Topology, abstract_devices


def _factorisations(chips: int, max_tensor: int = 8):
    """(data, fsdp, tensor) with tensor a power of two <= max_tensor; data*fsdp split as all
    fsdp, all data, and their square-ish middle (more splits rarely change the verdict)."""
    out = []
    t = 1
    while t <= min(chips, max_tensor):
        if chips % t == 0:
            rest = chips // t
            d_mid = 2 ** (int(math.log2(rest)) // 2) if rest & (rest - 1) == 0 else 1
            for d in sorted({1, d_mid, rest}):
                out.append((d, rest // d, t))
        t *= 2
    return out


def search(cfg, topo: Topology, hbm_bytes: int = 0, log=print, max_accum: int = 8) -> dict:
    """Try meshes x remat policies x micro-batch counts; per mesh the first that fits in the
    order none, minimal, full, then more micro-batches (each step costs time, not memory).
    -> {"candidates": [report...] fitting, fastest first, "tried": [...], "best": report|None,
    "why_none": str}."""
    from t5lite import config as config_lib
    devices = abstract_devices(topo)
    fitting, tried = [], []
    remats = ("none", "minimal", "full")
    for data, fsdp, tensor in _factorisations(topo.chips):
        accums = [a for a in (1, 2, 4, 8, 16) if a <= max_accum]
        for accum, remat in itertools.product(accums, remats):
            sets = [f"mesh.data={data}", f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}",
                    f"model.remat={remat}", f"train.grad_accum_steps={accum}"]
            c = config_lib.apply_overrides(cfg, sets)
            try:
                r = compile_step(c, topo, devices, hbm_bytes)
            except UserError as e:  # does not divide the batch / parameters: next mesh
                tried.append({"set": sets, "error": str(e)})
                log(f"  skip {' '.join(sets)}: {e}")
                break
            r["set"] = sets
            tried.append(r)
            log(f"  {' '.join(sets)}: {r['bytes_per_chip']['total'] / GiB:.2f} GiB per chip, "
                f"{'fits' if r['fits'] else 'does not fit'}"
                + (f", expected {r['expected_step_seconds']:.3g} s" if r["compiled"] else
                   " (XLA: out of HBM)"))
            if r["fits"]:
                fitting.append(r)
                break
        else:
            continue
    fitting.sort(key=lambda r: r["expected_step_seconds"])
    why = ""
    if not fitting:
        compiled = [r for r in tried if "fits" in r]
        if compiled:
            low = min(compiled, key=lambda r: r["bytes_per_chip"]["total"])
            hbm = low["hbm_bytes_per_chip"]
            why = (f"nothing fits {topo.name}: the smallest, {' '.join(low['set'])}, needs "
                   f"{low['bytes_per_chip']['total'] / GiB:.2f} GiB per chip of "
                   f"{hbm / GiB:.2f} GiB HBM. Use a larger slice, a smaller data.batch_size "
                   f"or shorter data.feature_lengths.")
        else:
            why = (f"no mesh of {topo.chips} chips divides this config: "
                   + (tried[0]["error"] if tried else "nothing to try"))
    return {"candidates": fitting, "tried": tried, "best": fitting[0] if fitting else None,
            "why_none": why}
