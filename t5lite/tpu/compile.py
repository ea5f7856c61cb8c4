"""Compile a config's real train step (or its decoding program) for a TPU slice on any host
(no TPU needed), and say whether it fits the chips' HBM and how fast it should run.

Path: topology -> abstract TPU devices (topology.abstract_devices, needs libtpu) -> the
config's (data, fsdp, tensor) mesh over them -> trainer.make_train_step(...).jitted traced with
ShapeDtypeStructs carrying NamedShardings -> lower -> compile -> memory_analysis (per chip,
memory.py), cost_analysis and the compiled HLO (hlo_cost.py) -> a roofline bound from the chip
table and the expected step (step_time.py: the scheduled HLO replayed on the slice's torus).
(MaxText's train_compile.py is the precedent.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import time

from t5lite.monitor import flops as flops_lib
from t5lite.mesh import advice
from t5lite.mesh.topology import Topology, abstract_devices
from t5lite.tpu import hlo_cost, memory, step_time

_CACHE: dict = {}  # (config JSON, topology) -> report: --search revisits configs


@contextlib.contextmanager
def _no_persistent_cache():
    """Nothing of these compiles is written to JAX's persistent compilation cache
    ($JAX_COMPILATION_CACHE_DIR, which TPU VM users set): an executable compiled for abstract
    TPU devices cannot be loaded back (no client), so storing it only made the next run warn
    and compile again. (jax_enable_compilation_cache is read once a process, at its first
    compile; the least compile time an entry needs is read at every write.)"""
    import jax
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def compile_step(cfg, topo: Topology, devices=None, hbm_bytes: int = 0) -> dict:
    """Compile cfg's train step for `topo` -> the report (see CONTRACTS.md, `t5lite compile`).
    `hbm_bytes` (default: the chip's) is what `fits` compares the per-chip total against.
    ``devices``: the slice's abstract devices (default: topology.abstract_devices(topo))."""
    from t5lite import config as config_lib
    from t5lite.mesh import partitioning
    d = config_lib.to_dict(cfg)  # the key holds the resolved mesh: fsdp=-1 == fsdp=<chips>
    d["mesh"] = dict(d["mesh"], **dict(zip(partitioning.MESH_AXES,
                                           partitioning.mesh_shape(cfg.mesh, topo.chips))))
    key = (json.dumps(d, sort_keys=True, default=str), topo.jax_name)
    if key not in _CACHE:
        _CACHE[key] = _compile(cfg, topo, devices)
    r = dict(_CACHE[key], topology=topo.name)
    hbm = hbm_bytes or topo.chip.hbm_bytes
    total = r["bytes_per_chip"]["total"]
    return dict(r, fits=r["compiled"] and total <= hbm, hbm_bytes_per_chip=hbm,
                headroom_bytes=hbm - total, mesh_advice=advice.mesh_advice(
                    r["mesh"], r["bytes_per_chip"]["params"], r["bytes_per_chip"]["opt_state"],
                    hbm))


def trace_train_step(cfg, mesh, model, tx, differentiate_all: bool = False):
    """The real train step traced with ShapeDtypeStructs on ``mesh`` -> (abstract train state,
    traced); ``traced.lower().compile().memory_analysis()`` gives its bytes. Used for any
    devices (abstract TPU ones here; one CPU device in the PEFT memory test and bench).
    ``differentiate_all``: gradients of every param, frozen ones included (for comparing
    what differentiating only the trainable ones saves)."""
    import jax

    from t5lite.models import dummy_batch
    from t5lite.mesh import partitioning
    from t5lite.train import trainer

    abstract, shardings, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    trainable = jax.tree.map(lambda _: True, shardings.params) if differentiate_all else None
    step = trainer.make_train_step(cfg, model, tx, mesh, shardings, trainable=trainable)
    batch_sharding = partitioning.batch_sharding(mesh)
    host = dummy_batch(cfg.model, cfg.data.batch_size, cfg.data.feature_lengths)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
             for k, v in host.items()}
    with partitioning.activate(mesh):
        return abstract, step.jitted.trace(abstract, batch)


def versions() -> dict:
    """{jax, libtpu}: the compiler versions a report records (another compiles the same config
    to another program)."""
    from importlib import metadata

    import jax
    return {"jax": jax.__version__, "libtpu": metadata.version("libtpu")}


def _step_fields(cfg, topo: Topology, mesh) -> dict:
    """The report's description of the step and the slice, and what compiled it (the XLA
    options and versions: the same config compiles to another program under others)."""
    from t5lite.mesh import partitioning
    return {"config": cfg.name, "topology": topo.name, "jax_topology": topo.jax_name,
            "chip": topo.chip.name, "chips": mesh.size, "mesh": dict(mesh.shape),
            "remat": cfg.model.remat, "collective_matmul": cfg.mesh.collective_matmul,
            "grad_accum_steps": cfg.train.grad_accum_steps,
            "batch_size": cfg.data.batch_size,
            "tokens_per_step": flops_lib.tokens_per_step(cfg),
            "compiler_options": partitioning.tpu_compiler_options(
                topo.chip.name, cfg.mesh.collective_matmul),
            "versions": versions()}


def _mesh_and_model(cfg, topo: Topology, devices=None, grad_accum_steps: int = 1):
    """The slice's mesh (the batch checked against it) and cfg's model built with the
    accelerator's gradient rules, whatever this host's backend is."""
    from t5lite import peft
    from t5lite.mesh import partitioning

    devices = devices if devices is not None else abstract_devices(topo)
    mesh = partitioning.make_mesh(cfg.mesh, devices)
    partitioning.check_batch(mesh, cfg.data.batch_size, grad_accum_steps)
    return mesh, peft.build_model(dataclasses.replace(cfg.model, gradient_rules="accelerator"))


def _compile(cfg, topo: Topology, devices=None) -> dict:
    import jax

    from t5lite.mesh import partitioning
    from t5lite.train import optim, trainer

    mesh, model = _mesh_and_model(cfg, topo, devices, cfg.train.grad_accum_steps)
    tx = optim.optimizer_for(cfg, cfg.train.steps)
    t0 = time.time()
    abstract, traced = trace_train_step(cfg, mesh, model, tx)
    with partitioning.activate(mesh):
        lowered = traced.lower()
        model_flops = trainer.step_flops(cfg, model, mesh, abstract.params,
                                         cfg.data.batch_size)
    try:
        with _no_persistent_cache():
            compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return _out_of_memory(cfg, topo, mesh, abstract, model_flops, str(e),
                              time.time() - t0)
    seconds = time.time() - t0
    report = {"config": cfg.name, "compiled": True}
    report.update(_step_fields(cfg, topo, mesh))
    report.update(_compiled_fields(cfg, topo, mesh, abstract, traced, compiled, model_flops))
    report["compile_seconds"] = seconds
    return report


def _cost_analysis(compiled) -> dict:
    cost = compiled.cost_analysis() or {}
    return cost[0] if isinstance(cost, list) else cost  # older jax: one dict per program


def _compiled_fields(cfg, topo, mesh, abstract, traced, compiled, model_flops) -> dict:
    """Memory, FLOPs, bytes, collectives, the roofline bound and the expected time of a
    compiled step.

    FLOPs, HBM bytes and the per-instruction roofline count every while loop's trip count,
    read from the compiled HLO (XLA's cost_analysis counts a loop body once, and on TPU it
    adds loops of its own: the collective matmuls of fsdp; its "bytes accessed" also counts
    operands that memory-space assignment placed in VMEM). FLOPs: the HLO's convolutions and
    dots, counted exactly."""
    cost = _cost_analysis(compiled)
    chip = topo.chip
    text = compiled.as_text()
    hlo = hlo_cost.hlo_costs(text, chip)
    params = advice.leaf_bytes(abstract.params)
    opt = advice.leaf_bytes(abstract.opt_state)
    mem_bytes = memory.memory_bytes(compiled.memory_analysis())
    times = hlo_cost.roofline_seconds(hlo, chip)
    bound = max(times.values())
    coords = [getattr(d, "coords", None) for d in mesh.devices.flat]
    exp = step_time.expected_step(text, chip, topo.shape,
                                  coords if None not in coords else None)
    expected = max(exp["seconds"], bound)  # never below the bound (prefetch DMAs are in it)
    model_per_chip = model_flops / mesh.size
    tokens = flops_lib.tokens_per_step(cfg)
    floor = memory.analytic_bytes(cfg, dict(mesh.shape), params, opt)
    return {
        "bytes_per_chip": dict({"params": params, "opt_state": opt}, **mem_bytes),
        "analytic_bytes_per_chip": floor,
        "total_over_analytic": mem_bytes["total"] / max(floor["total"], 1),
        "flops_per_chip": float(hlo["matmul_flops"]),
        # of which Pallas kernels' own analytic counts (XLA cannot see inside a kernel)
        "kernel_flops_per_chip": float(hlo.get("kernel_flops", 0)),
        "model_flops_per_chip": model_per_chip,
        "model_flops_with_remat_per_chip":
            flops_lib.jaxpr_matmul_flops(traced.jaxpr.jaxpr) / mesh.size,
        "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
        "loop_scale": hlo["matmul_flops"] / max(hlo["matmul_flops_once"], 1),
        "bytes_accessed_per_chip": float(hlo["bytes"]),
        "xla_bytes_accessed_per_chip":
            float(cost.get("bytes accessed", 0.0)) * hlo["bytes"] / max(hlo["bytes_once"], 1),
        "collectives": hlo["collectives"],
        "collective_bytes_per_chip": sum(c["bytes"] for c in hlo["collectives"].values()),
        "roofline_seconds": times,
        "bound": hlo_cost.roofline_bound(times, hlo["op_seconds_hbm_bound"]),
        "roofline_step_seconds": bound,
        "roofline_tokens_per_s": tokens / bound if bound else 0.0,
        "roofline_mfu": model_per_chip / (bound * chip.peak_flops) if bound else 0.0,
        "expected_seconds": {"compute": exp["compute_seconds"],
                             "collectives": exp["collective_seconds"],
                             "exposed_collectives": exp["exposed_seconds"]},
        "expected_collectives": {"sync": exp["sync_collectives"],
                                 "async": exp["async_collectives"]},
        "expected_step_seconds": expected,
        "expected_tokens_per_s": tokens / expected if expected else 0.0,
        "expected_mfu": model_per_chip / (expected * chip.peak_flops) if expected else 0.0,
    }


def _out_of_memory(cfg, topo, mesh, abstract, model_flops, msg, seconds) -> dict:
    """XLA refuses to compile a program whose peak exceeds the chip's HBM: report it as not
    fitting, with the size its message gives ("the total memory required for HLO temporaries
    (X)": X is the peak, arguments included, as memory_total reads it from a program that
    compiles; no FLOPs or time: nothing was compiled)."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    sizes = [float(n) * units[u] for n, u in re.findall(r"([\d.]+)([KMGT])i?B?\b", msg)]
    params, opt = advice.leaf_bytes(abstract.params), advice.leaf_bytes(abstract.opt_state)
    total = max(int(sizes[0]) if sizes else 0, params + opt)
    temp = total - params - opt
    return dict(_step_fields(cfg, topo, mesh), **{
        "compiled": False, "xla_error": msg.strip().splitlines()[0][:300],
        "bytes_per_chip": {"params": params, "opt_state": opt, "arguments": params + opt,
                           "outputs": 0, "aliased": 0, "temp": temp, "xla_temp": None,
                           "total": total},
        "flops_per_chip": None, "model_flops_per_chip": model_flops / mesh.size,
        "model_flops_with_remat_per_chip": None, "cost_analysis_flops_per_chip": None,
        "loop_scale": None, "bytes_accessed_per_chip": None,
        "xla_bytes_accessed_per_chip": None,
        "collectives": {}, "collective_bytes_per_chip": None, "roofline_seconds": {},
        "bound": None, "roofline_step_seconds": None, "roofline_tokens_per_s": None,
        "roofline_mfu": None, "expected_seconds": {}, "expected_collectives": {},
        "expected_step_seconds": None, "expected_tokens_per_s": None, "expected_mfu": None,
        "compile_seconds": seconds})


def _decode_input_length(cfg) -> int:
    """Prompt length of the decoding batch: inputs (enc-dec, BERT) or targets (decoder)."""
    lengths = cfg.data.feature_lengths
    if cfg.model.architecture == "encoder_decoder":
        return lengths.get("inputs")
    return lengths.get("targets", lengths.get("inputs"))


def _compile_decode_program(cfg, mesh, model, beams: int, samples: int, n_in: int):
    """decoding.generate_program jitted over ``mesh`` with abstract arguments, compiled ->
    (abstract train state, compiled)."""
    import jax
    import jax.numpy as jnp

    from t5lite.eval import decoding
    from t5lite.mesh import partitioning
    from t5lite.train import optim, trainer

    key = jax.eval_shape(lambda: jax.random.key(0))  # outside the abstract mesh
    knobs = dict(decoding.runtime_knobs(cfg.decode), eos_id=jnp.int32(1))
    abstract, shardings, _ = trainer.abstract_train_state(
        cfg, model, mesh, optim.optimizer_for(cfg, cfg.train.steps))
    batch_sharding = partitioning.batch_sharding(mesh)
    replicated = partitioning.replicated(mesh)
    fn = jax.jit(functools.partial(decoding.generate_program, model, beams, samples,
                                   cfg.decode.max_length),
                 in_shardings=(shardings.params, batch_sharding, batch_sharding,
                               replicated, replicated),
                 compiler_options=partitioning.compiler_options(cfg, mesh))
    b = cfg.data.batch_size
    args = (abstract.params,
            jax.ShapeDtypeStruct((b, n_in), jnp.int32, sharding=batch_sharding),
            jax.ShapeDtypeStruct((b,), jnp.int32, sharding=batch_sharding),
            jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated),
            jax.tree.map(lambda x: jax.ShapeDtypeStruct((), x.dtype, sharding=replicated),
                         knobs))
    with partitioning.activate(mesh), _no_persistent_cache():
        return abstract, fn.lower(*args).compile()


def compile_decode(cfg, topo: Topology, devices=None, hbm_bytes: int = 0) -> dict:
    """Compile cfg's decoding program (decoding.generate_program: prefill + the token loop
    with its KV cache; cfg.decode sets method, beams and max_length) for `topo`; batch =
    data.batch_size rows of the inputs length (enc-dec, BERT) or targets length (decoder
    prompts). Per chip: params, temporaries (the cache), total vs HBM; FLOPs as XLA counts
    them (the token loop's body once: about prefill + one decoding step)."""
    from t5lite import config as config_lib
    from t5lite.eval import decoding

    cfg = config_lib.with_decode_length(cfg)  # 0: as long as the targets
    mesh, model = _mesh_and_model(cfg, topo, devices)
    decoding.check(cfg.decode, cfg.model)
    n_in = _decode_input_length(cfg)
    beams = cfg.decode.beams if cfg.decode.method == "beam" else 0
    samples = cfg.decode.num_samples if cfg.decode.method == "self_consistency" else 0
    t0 = time.time()
    abstract, compiled = _compile_decode_program(cfg, mesh, model, beams, samples, n_in)
    cost = _cost_analysis(compiled)
    mem_bytes = memory.memory_bytes(compiled.memory_analysis())
    total = mem_bytes["total"]
    hbm = hbm_bytes or topo.chip.hbm_bytes
    hlo = hlo_cost.hlo_costs(compiled.as_text())
    return {"config": cfg.name, "program": "decode", "method": cfg.decode.method,
            "beams": beams, "max_length": cfg.decode.max_length, "topology": topo.name,
            "jax_topology": topo.jax_name, "chip": topo.chip.name, "chips": mesh.size,
            "mesh": dict(mesh.shape), "batch_size": cfg.data.batch_size, "input_length": n_in,
            "fits": total <= hbm, "hbm_bytes_per_chip": hbm, "headroom_bytes": hbm - total,
            "bytes_per_chip": dict({"params": advice.leaf_bytes(abstract.params)},
                                   **mem_bytes),
            "flops_per_chip": float(hlo["matmul_flops"]),
            "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
            "collectives": hlo["collectives"],
            "compile_seconds": time.time() - t0}
