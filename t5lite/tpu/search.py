"""`t5lite compile --search`: meshes x remat policies x collective matmuls on / off x
micro-batch counts compiled for a slice, the fitting ones ranked by expected step time
(step_time.py). Each variant compiles in a child process (isolated.py): a libtpu crash on one
variant is recorded and the search goes on."""

from __future__ import annotations

import math

from t5lite.errors import UserError
from t5lite.mesh.topology import GiB, Topology
from t5lite.tpu import isolated

REMATS = ("none", "minimal", "full")


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


def _variants(data: int, fsdp: int, tensor: int) -> list:
    """(remat, collective matmul) pairs to compile on a mesh: collective matmuls (XLA's
    windowed einsums) only exist where a matmul's weights are sharded (fsdp or tensor > 1)."""
    matmuls = (False, True) if fsdp > 1 or tensor > 1 else (False,)
    return [(remat, cm) for remat in REMATS for cm in matmuls]


def _try_variants(cfg, topo, compile_fn, hbm_bytes, log, tried, config_lib, mesh_sets,
                  variants) -> list | None:
    """Compile cfg with mesh_sets under each (remat, collective matmul) variant -> the reports
    that fit, or None when the mesh does not divide the config (UserError). A variant whose
    compile crashed is recorded in `tried` with "crashed" and skipped."""
    found = []
    for remat, matmuls in variants:
        sets = (mesh_sets[:3] + [f"model.remat={remat}", f"mesh.collective_matmul={matmuls}"]
                + mesh_sets[3:])
        try:
            r = compile_fn(config_lib.apply_overrides(cfg, sets), topo, hbm_bytes=hbm_bytes)
        except UserError as e:
            tried.append({"set": sets, "error": str(e)})
            log(f"  skip {' '.join(sets)}: {e}")
            return None
        except isolated.CompilerCrashed as e:
            tried.append({"set": sets, "crashed": str(e)})
            log(f"  {' '.join(sets)}: CRASHED: {e}; going on without it")
            continue
        r["set"] = sets
        tried.append(r)
        log(f"  {' '.join(sets)}: {r['bytes_per_chip']['total'] / GiB:.2f} GiB per chip, "
            f"{'fits' if r['fits'] else 'does not fit'}"
            + (f", expected {r['expected_step_seconds']:.3g} s" if r["compiled"] else
               " (XLA: out of HBM)"))
        if r["fits"]:
            found.append(r)
    return found


def search(cfg, topo: Topology, hbm_bytes: int = 0, log=print, max_accum: int = 8,
           compile_fn=None, fixed: dict | None = None) -> dict:
    """Try meshes x remat policies x collective matmuls x micro-batch counts: per mesh every
    remat policy (none, minimal, full), each with collective matmuls off and on (where the
    mesh shards weights), each policy at the fewest micro-batches it fits with (more micro-
    batches of one global batch re-gather the sharded weights and cost time, not memory;
    bench/RESULTS.md). So remat none with two micro-batches is ranked beside remat full with
    one. All variants that fit are compiled: less remat is not always faster (a step without
    remat can be HBM-bound and slower; bench/RESULTS.md, issue 34), and collective matmuls
    trade HBM traffic for overlapped ICI transfers.
    The policies go full, minimal, none (tests/test_compile.py: compiled temporaries fall
    strictly none > minimal > full), each from the count the one before fit with: where remat
    full fits with no count, the others are not compiled on that mesh. A policy stops adding
    micro-batches once its compiled step is already slower than the mesh's fastest fit.
    ``compile_fn(cfg, topo, hbm_bytes=)``: default, compile.compile_step in this process's
    compiler process (isolated.shared()). ``fixed`` {mesh axis: size}: only meshes with
    those sizes (`--search --set mesh.tensor=4`: the rest of the space at 4-way tensor
    parallelism, a third of the compiles of a whole search).
    -> {"candidates": [report...] fitting, fastest first, "tried": [...], "best": report|None,
    "crashed": [{"set", "crashed"}...] variants whose compile crashed, "why_none": str}."""
    from t5lite import config as config_lib
    compile_fn = compile_fn or isolated.shared().compile
    fitting, tried = [], []
    meshes = [m for m in _factorisations(topo.chips)
              if all(dict(zip(("data", "fsdp", "tensor"), m))[a] == n
                     for a, n in (fixed or {}).items())]
    if not meshes:
        raise UserError(f"no mesh of {topo.chips} chips that --search tries has "
                        + ", ".join(f"mesh.{a}={n}" for a, n in fixed.items())
                        + f"; it tries {_factorisations(topo.chips)} as (data, fsdp, tensor)")
    counts = [a for a in (1, 2, 4, 8, 16) if a <= max_accum]
    for mesh in meshes:
        def compile_at(variants, accum, mesh=mesh):
            sets = [f"mesh.{a}={n}" for a, n in zip(("data", "fsdp", "tensor"), mesh)]
            return _try_variants(cfg, topo, compile_fn, hbm_bytes, log, tried, config_lib,
                                 sets + [f"train.grad_accum_steps={accum}"], variants)
        fitting += _search_mesh(mesh, counts, compile_at, tried, log)
    fitting.sort(key=lambda r: r["expected_step_seconds"])
    crashed = [r for r in tried if "crashed" in r]
    return {"candidates": fitting, "tried": tried, "best": fitting[0] if fitting else None,
            "crashed": crashed, "why_none": "" if fitting else _why_none(topo, tried, crashed)}


def _search_mesh(mesh, counts, compile_at, tried, log) -> list:
    """One mesh: each remat policy (full first) at the fewest micro-batch count at which one
    of its collective-matmul variants fits, counting on from where the policy before it fit
    -> the reports that fit. compile_at(variants, accum) -> fitting reports, or None (the
    mesh does not divide the config)."""
    found_here, first = [], 0
    for remat in reversed(REMATS):  # full first: REMATS lists the most saved activations first
        variants = [v for v in _variants(*mesh) if v[0] == remat]
        for i in range(first, len(counts)):
            n_tried = len(tried)
            found = compile_at(variants, counts[i])
            if found is None:  # does not divide the batch / parameters: next mesh
                return found_here
            if found:
                found_here += found
                first = i
                break
            if not any("fits" in r for r in tried[n_tried:]):
                break  # every variant crashed: another count would not tell more
            steps = [r["expected_step_seconds"] for r in tried[n_tried:] if r.get("compiled")]
            fastest = min((r["expected_step_seconds"] for r in found_here), default=None)
            if steps and fastest is not None and min(steps) >= fastest:
                log(f"  remat {remat} does not fit with {counts[i]} micro-batches and is "
                    "already slower than this mesh's fastest fit: more are not compiled")
                first = i + 1  # the policies that save more fit with no fewer either
                break
        else:
            log(f"  remat {remat} fits with no micro-batch count up to {counts[-1]}: the "
                "policies that save more activations are not compiled on this mesh")
            return found_here
    return found_here


def _why_none(topo: Topology, tried: list, crashed: list) -> str:
    compiled = [r for r in tried if "fits" in r]
    refused = [r for r in tried if "error" in r]
    if compiled:
        low = min(compiled, key=lambda r: r["bytes_per_chip"]["total"])
        hbm = low["hbm_bytes_per_chip"]
        why = (f"nothing fits {topo.name}: the smallest, {' '.join(low['set'])}, needs "
               f"{low['bytes_per_chip']['total'] / GiB:.2f} GiB per chip of "
               f"{hbm / GiB:.2f} GiB HBM. Use a larger slice, a smaller data.batch_size "
               f"or shorter data.feature_lengths.")
    elif crashed:
        why = f"every variant tried on {topo.name} crashed the compiler."
    else:
        why = (f"no mesh of {topo.chips} chips divides this config: "
               + (refused[0]["error"] if refused else "nothing to try"))
    if crashed:
        why += (f" {len(crashed)} variants crashed the compiler and are not counted, e.g. "
                + "; ".join(" ".join(r["set"]) for r in crashed[:2])
                + f" ({crashed[0]['crashed']}).")
    return why
