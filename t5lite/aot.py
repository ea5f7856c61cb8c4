"""Compile a config's real train step for a TPU slice on any host (no TPU needed), and say
whether it fits the chips' HBM and how fast it should run.

Path: topology name -> abstract TPU devices (jax.experimental.topologies, needs libtpu) -> the
config's (data, fsdp, tensor) mesh over them -> trainer.make_train_step(...).jitted traced with
ShapeDtypeStructs carrying NamedShardings -> lower -> compile -> memory_analysis (per chip),
cost_analysis and the compiled HLO (collectives) -> a roofline from CHIPS. `--search` repeats it
over meshes, remat policies and micro-batch counts. (MaxText's train_compile.py is the
precedent.)

Loops: XLA's cost_analysis counts a while loop's body once (scanned layers, gradient
accumulation). FLOPs and bytes are scaled by the step's loop structure read from its jaxpr: the
ratio of its matmul FLOPs with scan trip counts to those with every body counted once (exact
for FLOPs when matmuls dominate, an approximation for bytes). Collectives come from the
compiled HLO with each while loop's trip count (the constant its condition compares against).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import os
import re

from t5lite.errors import UserError

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip facts of one TPU generation (one JAX device = one chip, megacore on v4/v5p)."""
    name: str
    hbm_bytes: int
    hbm_bw: float  # bytes/s
    peak_flops: float  # dense bf16 FLOP/s
    ici_bw: float  # bytes/s, bidirectional inter-chip interconnect per chip
    dims: int  # torus dimensions: gcloud suffix counts TensorCores (2 per chip) when 3


CHIPS = {
    # https://cloud.google.com/tpu/docs/v4 : 275 TFLOP/s bf16, HBM2 32 GiB at 1200 GB/s. The
    # page gives no per-chip ICI figure; 268 GB/s = its "all-reduce bandwidth per Pod 1.1 PB/s"
    # over the Pod's 4096 chips.
    "v4": Chip("v4", 32 * GiB, 1200e9, 275e12, 1.1e15 / 4096, 3),
    # https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, HBM2 16 GB at 819 GB/s,
    # bidirectional ICI 400 GB/s per chip.
    "v5e": Chip("v5e", 16 * GiB, 819e9, 197e12, 400e9, 2),
    # https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, HBM2e 95 GiB at 2765 GB/s,
    # bidirectional ICI 1200 GB/s per chip (4800 Gbps).
    "v5p": Chip("v5p", 95 * GiB, 2765e9, 459e12, 1200e9, 3),
    # https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, HBM 32 GB at 1638 GB/s,
    # bidirectional ICI 800 GB/s per chip.
    "v6e": Chip("v6e", 32 * GiB, 1638e9, 918e12, 800e9, 2),
}
_GCLOUD_PREFIX = {"v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v5e": "v5e", "v6e": "v6e"}
TOPOLOGY_HELP = ("a gcloud accelerator type (v4-8, v5p-32, v5litepod-16, v6e-8) or a JAX "
                 "topology name (v5p:2x2x4, v5e:4x4, v6e:2x4)")


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # as the user typed it
    chip: Chip
    shape: tuple  # chips per torus dimension

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def jax_name(self) -> str:
        return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"


def _default_shape(chips: int, dims: int) -> tuple:
    """The slice shapes Cloud TPU creates for a chip count: 2x2(x1) doubled one axis at a time,
    the smallest first (4 -> 2x2x1, 8 -> 2x2x2, 16 -> 2x2x4, 32 -> 2x4x4, 64 -> 4x4x4 ...)."""
    if chips == 1:
        return (1,) * dims
    if chips < 4 or chips & (chips - 1):
        raise UserError(f"no standard {dims}-D TPU slice has {chips} chips; give the shape as "
                        f"a JAX topology name, e.g. {'v5p:2x2x4' if dims == 3 else 'v5e:4x4'}")
    shape = [2, 2] + [1] * (dims - 2)
    while math.prod(shape) < chips:
        i = max(j for j in range(dims) if shape[j] == min(shape))
        shape[i] *= 2
    return tuple(shape)


def parse_topology(name: str) -> Topology:
    """gcloud accelerator types (v4 and v5p count TensorCores, 2 per chip; v5litepod and v6e
    count chips) and JAX topology names (generation:AxBxC) -> Topology."""
    text = name.strip().lower()
    m = re.fullmatch(r"(v4|v5p|v5litepod|v5e|v6e)-(\d+)", text)
    if m:
        chip = CHIPS[_GCLOUD_PREFIX[m.group(1)]]
        n = int(m.group(2))
        if chip.dims == 3:
            if n % 2 or n < 8:
                raise UserError(f"{name}: {chip.name} accelerator types count TensorCores (2 "
                                f"per chip), e.g. {chip.name}-8 = 4 chips; use {TOPOLOGY_HELP}")
            n //= 2
        return Topology(name, chip, _default_shape(n, chip.dims))
    m = re.fullmatch(r"(v4|v5p|v5litepod|v5e|v6e):(\d+(?:x\d+)+)", text)
    if m:
        chip = CHIPS[_GCLOUD_PREFIX[m.group(1)]]
        shape = tuple(int(d) for d in m.group(2).split("x"))
        if len(shape) != chip.dims or 0 in shape:
            raise UserError(f"{name}: a {chip.name} topology has {chip.dims} dimensions "
                            f"(e.g. {chip.name}:{'x'.join(['2'] * chip.dims)})")
        return Topology(name, chip, shape)
    raise UserError(f"unknown TPU topology {name!r}: use {TOPOLOGY_HELP}")


def require_libtpu() -> None:
    """UserError (saying what to install) when libtpu is missing."""
    if importlib.util.find_spec("libtpu") is None:
        import jax
        raise UserError("compiling for a TPU needs libtpu: pip install "
                        f"'jax[tpu]=={jax.__version__}' (or pip install -e '.[tpu]')")


def abstract_devices(topo: Topology):
    """Abstract TPU devices of the slice (compile-only: nothing runs on them)."""
    require_libtpu()
    import glob
    if not glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*"):
        # no TPU chips here: libtpu's probes for them would only log noise (on a TPU VM they
        # find the real values)
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    from jax.experimental import topologies
    kw = {"chip_config_name": "megacore" if topo.chip.dims == 3 else "default"}
    if topo.chips < 4:
        kw["chips_per_host_bounds"] = (1, 1, 1)
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=topo.jax_name,
                                            **kw).devices
    except Exception as e:  # noqa: BLE001 - libtpu raises plain runtime errors
        msg = str(e)
        if "lockfile" in msg:
            raise UserError("another process has libtpu loaded; set ALLOW_MULTIPLE_LIBTPU_LOAD=1 "
                            "to compile beside it") from None
        raise UserError(f"libtpu refused topology {topo.jax_name} ({msg.splitlines()[0][:200]}); "
                        f"use {TOPOLOGY_HELP}") from None


# ---------------------------------------------------------------------------- HLO


_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                "collective-permute", "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_OP = re.compile(r"=\s*(.+?)\s+([a-z][\w\-]*)\(")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def _shape_bytes(text: str) -> int:
    return sum(_DTYPE_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims in _SHAPE.findall(text))


def hlo_collectives(hlo_text: str) -> dict:
    """{kind: {"count", "bytes"}} per chip for one step, while-loop bodies times their trip
    count. Bytes: the larger of an op's operands and result (an all-gather's gathered result,
    a reduce-scatter's full operand); an all-reduce counts twice (reduce-scatter + all-gather)."""
    comps, entry, cur = {}, None, None
    for line in hlo_text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            cur = comps.setdefault(m.group(1), [])
            if line.startswith("ENTRY"):
                entry = m.group(1)
        elif cur is not None and line.startswith(" "):
            cur.append(line)
    sizes = {}  # instruction name -> result bytes (compiled HLO names operands without shapes)
    for lines in comps.values():
        for line in lines:
            d = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.+?) [a-z][\w\-]*\(", line)
            if d:
                sizes[d.group(1)] = _shape_bytes(d.group(2))
    trip = {}
    for lines in comps.values():
        for line in lines:
            if " while(" in line:
                cond = re.search(r"condition=%?([\w.\-]+)", line)
                body = re.search(r"body=%?([\w.\-]+)", line)
                consts = [int(c) for c in re.findall(r"s32\[\][^=]*constant\((\d+)\)",
                                                     "\n".join(comps.get(cond.group(1), [])))]
                trip[body.group(1)] = max(consts) if consts else 1
    mult = {}

    def visit(name, m):
        if name not in comps:
            return
        mult[name] = mult.get(name, 0) + m
        for line in comps[name]:
            callees = _CALLS.findall(line)
            b = _BRANCHES.search(line)
            if b:
                callees += [c.strip().lstrip("%") for c in b.group(1).split(",")]
            for c in callees:
                visit(c, m * trip.get(c, 1))

    visit(entry, 1)
    out = {}
    for name, m in mult.items():
        for line in comps[name]:
            op = _OP.search(line)
            if not op:
                continue
            kind = op.group(2)
            base = kind[:-6] if kind.endswith("-start") else kind
            if base not in _COLLECTIVES or kind.endswith("-done"):
                continue
            result = _shape_bytes(op.group(1))
            args = line[op.end():]
            args = args[:args.find(")") if ")" in args else len(args)]
            operands = sum(sizes.get(a, 0) for a in re.findall(r"%([\w.\-]+)", args))
            nbytes = max(result, operands, _shape_bytes(args))
            if kind.endswith("-start"):  # async: the result tuple holds operand and output
                nbytes = max(_shape_bytes(s) for s in _split_tuple(op.group(1))) \
                    if op.group(1).startswith("(") else result
            nbytes *= 2 if base == "all-reduce" else 1
            rec = out.setdefault(base, {"count": 0, "bytes": 0})
            rec["count"] += m
            rec["bytes"] += m * nbytes
    return out


def _split_tuple(text: str) -> list:
    return [s for s in re.split(r",\s*(?![^\[]*\])", text.strip("()")) if s]


# ---------------------------------------------------------------------------- FLOPs


def _matmul_flops(jaxpr, scale_loops: bool) -> int:
    from t5lite import metrics_log
    import jax.extend as jex
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            total += metrics_log.dot_flops(eqn)
        n = 1
        if eqn.primitive.name == "scan":  # XLA's loop body holds `unroll` iterations
            length, unroll = eqn.params["length"], eqn.params.get("unroll", 1)
            n = length if scale_loops else min(length, length if unroll is True else
                                               max(int(unroll), 1))
        for sub in jex.core.jaxprs_in_params(eqn.params):
            total += n * _matmul_flops(sub, scale_loops)
    return total


def _out_bytes(jaxpr, scale_loops: bool) -> int:
    """Bytes of every value the jaxpr produces (a proxy for memory traffic), loops as above."""
    import jax.extend as jex
    total = 0
    for eqn in jaxpr.eqns:
        subs = list(jex.core.jaxprs_in_params(eqn.params))
        if not subs:
            total += sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize
                         for v in eqn.outvars if hasattr(v.aval, "shape"))
        n = 1
        if eqn.primitive.name == "scan":
            length, unroll = eqn.params["length"], eqn.params.get("unroll", 1)
            n = length if scale_loops else min(length, length if unroll is True else
                                               max(int(unroll), 1))
        for sub in subs:
            total += n * _out_bytes(sub, scale_loops)
    return total


# ---------------------------------------------------------------------------- compile


def _leaf_bytes(tree) -> int:
    """Bytes per chip of a tree of ShapeDtypeStructs with shardings."""
    import jax
    n = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        n += math.prod(shape) * x.dtype.itemsize
    return n


def _tokens(cfg) -> int:
    lengths = cfg.data.feature_lengths
    per_row = {"encoder_decoder": lengths.get("inputs", 0) + lengths.get("targets", 0),
               "encoder_only": lengths.get("inputs", 0)}.get(
        cfg.model.architecture, sum(lengths.values()))
    return cfg.data.batch_size * per_row


_CACHE: dict = {}  # (config JSON, topology) -> report: --search revisits configs


def compile_step(cfg, topo: Topology, devices=None, hbm_bytes: int = 0) -> dict:
    """Compile cfg's train step for `topo` -> the report (see CONTRACTS.md, `t5lite compile`).
    `hbm_bytes` (default: the chip's) is what `fits` compares the per-chip total against."""
    from t5lite import config as config_lib
    from t5lite import partitioning
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
                headroom_bytes=hbm - total)


def trace_train_step(cfg, mesh, model, tx, differentiate_all: bool = False):
    """The real train step traced with ShapeDtypeStructs on ``mesh`` -> (abstract train state,
    traced); ``traced.lower().compile().memory_analysis()`` gives its bytes. Used for any
    devices (abstract TPU ones here; one CPU device in the PEFT memory test and bench).
    ``differentiate_all``: gradients of every param, as before issue 19 (for comparisons)."""
    import jax

    from t5lite import partitioning, trainer
    from t5lite.models import dummy_batch

    abstract, shardings, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    trainable = jax.tree.map(lambda _: True, shardings.params) if differentiate_all else None
    step = trainer.make_train_step(cfg, model, tx, mesh, shardings, trainable=trainable)
    bsh = partitioning.batch_sharding(mesh)
    host = dummy_batch(cfg.model, cfg.data.batch_size, cfg.data.feature_lengths)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=bsh) for k, v in host.items()}
    with partitioning.activate(mesh):
        return abstract, step.jitted.trace(abstract, batch)


def _compile(cfg, topo: Topology, devices=None) -> dict:
    import time

    import jax

    from t5lite import partitioning, trainer
    from t5lite.models import build_model, layers, peft

    devices = devices if devices is not None else abstract_devices(topo)
    mesh = partitioning.make_mesh(cfg.mesh, devices)
    partitioning.check_batch(mesh, cfg.data.batch_size, cfg.train.grad_accum_steps)
    model = build_model(cfg.model)
    tx = peft.make_optimizer(cfg, cfg.train.steps)
    t0 = time.time()
    with layers.target_platform("tpu"):
        abstract, traced = trace_train_step(cfg, mesh, model, tx)
        with partitioning.activate(mesh):
            lowered = traced.lower()
        with partitioning.activate(mesh):
            model_flops = trainer.step_flops(cfg, model, mesh, abstract.params,
                                             cfg.data.batch_size)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return _out_of_memory(cfg, topo, mesh, abstract, model_flops, str(e),
                                  time.time() - t0)
    seconds = time.time() - t0
    chips = mesh.size
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0]
    full = _matmul_flops(traced.jaxpr.jaxpr, True)
    once = _matmul_flops(traced.jaxpr.jaxpr, False)
    loop_scale = full / once if once else 1.0
    flops = float(cost.get("flops", 0.0)) * loop_scale
    bytes_scale = (_out_bytes(traced.jaxpr.jaxpr, True)
                   / max(_out_bytes(traced.jaxpr.jaxpr, False), 1))
    bytes_accessed = float(cost.get("bytes accessed", 0.0)) * bytes_scale
    coll = hlo_collectives(compiled.as_text())
    coll_bytes = sum(c["bytes"] for c in coll.values())
    params = _leaf_bytes(abstract.params)
    opt = _leaf_bytes(abstract.opt_state)
    total = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
             + mem.temp_size_in_bytes)
    chip = topo.chip
    times = {"compute": flops / chip.peak_flops, "hbm": bytes_accessed / chip.hbm_bw,
             "ici": coll_bytes / chip.ici_bw}
    est = max(times.values())
    model_per_chip = model_flops / chips
    return {
        "config": cfg.name,
        "compiled": True,
        "topology": topo.name,
        "jax_topology": topo.jax_name,
        "chip": chip.name,
        "chips": chips,
        "mesh": dict(mesh.shape),
        "remat": cfg.model.remat,
        "grad_accum_steps": cfg.train.grad_accum_steps,
        "batch_size": cfg.data.batch_size,
        "tokens_per_step": _tokens(cfg),
        "bytes_per_chip": {"params": params, "opt_state": opt,
                           "arguments": mem.argument_size_in_bytes,
                           "outputs": mem.output_size_in_bytes,
                           "aliased": mem.alias_size_in_bytes,
                           "temp": mem.temp_size_in_bytes, "total": total},
        "flops_per_chip": flops,
        "model_flops_per_chip": model_per_chip,
        "model_flops_with_remat_per_chip": full / chips,
        "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
        "loop_scale": loop_scale,
        "bytes_loop_scale": bytes_scale,
        "bytes_accessed_per_chip": bytes_accessed,
        "collectives": coll,
        "collective_bytes_per_chip": coll_bytes,
        "roofline_seconds": times,
        "bound": max(times, key=times.get),
        "est_step_seconds": est,
        "est_tokens_per_s": _tokens(cfg) / est if est else 0.0,
        "est_mfu": model_per_chip / (est * chip.peak_flops) if est else 0.0,
        "compile_seconds": seconds,
    }


def _out_of_memory(cfg, topo, mesh, abstract, model_flops, msg, seconds) -> dict:
    """XLA refuses to compile a program whose temporaries exceed the chip's HBM: report it as
    not fitting, with the sizes its message gives (no FLOPs or time: nothing was compiled)."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    sizes = [float(n) * units[u] for n, u in re.findall(r"([\d.]+)([KMGT])i?B?\b", msg)]
    params, opt = _leaf_bytes(abstract.params), _leaf_bytes(abstract.opt_state)
    temp = int(sizes[0]) if sizes else 0
    total = params + opt + temp
    return {"config": cfg.name, "topology": topo.name, "jax_topology": topo.jax_name,
            "chip": topo.chip.name, "chips": mesh.size, "mesh": dict(mesh.shape),
            "remat": cfg.model.remat, "grad_accum_steps": cfg.train.grad_accum_steps,
            "batch_size": cfg.data.batch_size, "tokens_per_step": _tokens(cfg),
            "compiled": False, "xla_error": msg.strip().splitlines()[0][:300],
            "bytes_per_chip": {"params": params, "opt_state": opt, "arguments": params + opt,
                               "outputs": 0, "aliased": 0, "temp": temp, "total": total},
            "flops_per_chip": None, "model_flops_per_chip": model_flops / mesh.size,
            "model_flops_with_remat_per_chip": None, "cost_analysis_flops_per_chip": None,
            "loop_scale": None, "bytes_loop_scale": None, "bytes_accessed_per_chip": None,
            "collectives": {}, "collective_bytes_per_chip": None, "roofline_seconds": {},
            "bound": None, "est_step_seconds": None, "est_tokens_per_s": None, "est_mfu": None,
            "compile_seconds": seconds}


def compile_decode(cfg, topo: Topology, devices=None, hbm_bytes: int = 0) -> dict:
    """Compile cfg's decoding program (decoding.generate_program: prefill + the token loop
    with its KV cache; cfg.decode sets method, beams and max_length) for `topo`; batch =
    data.batch_size rows of the inputs length (enc-dec, BERT) or targets length (decoder
    prompts). Per chip: params, temporaries (the cache), total vs HBM; FLOPs as XLA counts
    them (the token loop's body once: about prefill + one decoding step)."""
    import time

    import jax
    import jax.numpy as jnp

    from t5lite import decoding, partitioning, trainer
    from t5lite.models import build_model, layers, peft

    devices = devices if devices is not None else abstract_devices(topo)
    mesh = partitioning.make_mesh(cfg.mesh, devices)
    partitioning.check_batch(mesh, cfg.data.batch_size)
    model = build_model(cfg.model)
    decoding.check(cfg.decode, cfg.model)
    lengths = cfg.data.feature_lengths
    n_in = lengths.get("inputs") if cfg.model.architecture == "encoder_decoder" else \
        lengths.get("targets", lengths.get("inputs"))
    beams = cfg.decode.beams if cfg.decode.method == "beam" else 0
    samples = cfg.decode.num_samples if cfg.decode.method == "self_consistency" else 0
    key = jax.eval_shape(lambda: jax.random.key(0))  # outside the abstract mesh
    knobs = dict(decoding.runtime_knobs(cfg.decode), eos_id=jnp.int32(1))
    t0 = time.time()
    with layers.target_platform("tpu"):
        abstract, shardings, _ = trainer.abstract_train_state(
            cfg, model, mesh, peft.make_optimizer(cfg, cfg.train.steps))
        bsh, rep = partitioning.batch_sharding(mesh), partitioning.replicated(mesh)
        fn = jax.jit(functools.partial(decoding.generate_program, model, beams, samples,
                                       cfg.decode.max_length),
                     in_shardings=(shardings.params, bsh, bsh, rep, rep))
        b = cfg.data.batch_size
        args = (abstract.params, jax.ShapeDtypeStruct((b, n_in), jnp.int32, sharding=bsh),
                jax.ShapeDtypeStruct((b,), jnp.int32, sharding=bsh),
                jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep),
                jax.tree.map(lambda x: jax.ShapeDtypeStruct((), x.dtype, sharding=rep), knobs))
        with partitioning.activate(mesh):
            compiled = fn.lower(*args).compile()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    total = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
             + mem.temp_size_in_bytes)
    hbm = hbm_bytes or topo.chip.hbm_bytes
    return {"config": cfg.name, "program": "decode", "method": cfg.decode.method,
            "beams": beams, "max_length": cfg.decode.max_length, "topology": topo.name,
            "jax_topology": topo.jax_name, "chip": topo.chip.name, "chips": mesh.size,
            "mesh": dict(mesh.shape), "batch_size": b, "input_length": n_in,
            "fits": total <= hbm, "hbm_bytes_per_chip": hbm, "headroom_bytes": hbm - total,
            "bytes_per_chip": {"params": _leaf_bytes(abstract.params),
                               "arguments": mem.argument_size_in_bytes,
                               "outputs": mem.output_size_in_bytes,
                               "temp": mem.temp_size_in_bytes, "total": total},
            "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
            "collectives": hlo_collectives(compiled.as_text()),
            "compile_seconds": time.time() - t0}


def format_decode_report(r: dict) -> str:
    b = r["bytes_per_chip"]
    g = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    return "\n".join([
        f"{r['config']} decoding ({r['method']}, beams {r['beams']}, {r['max_length']} new "
        f"tokens) on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
        + " ".join(f"{k}={v}" for k, v in r["mesh"].items())
        + f", batch {r['batch_size']} x {r['input_length']}",
        f"per chip: params {g(b['params'])}, temporaries (KV cache, logits) {g(b['temp'])}, "
        f"total {g(b['total'])} of {g(r['hbm_bytes_per_chip'])} HBM",
        ("FITS" if r["fits"] else "DOES NOT FIT") + f": headroom {g(r['headroom_bytes'])}",
        f"FLOPs per chip as XLA counts them (token loop once): "
        f"{r['cost_analysis_flops_per_chip']:.3g}",
        f"compiled in {r['compile_seconds']:.0f} s"])


# ---------------------------------------------------------------------------- search


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
                + (f", est {r['est_step_seconds']:.3g} s" if r["compiled"] else
                   " (XLA: out of HBM)"))
            if r["fits"]:
                fitting.append(r)
                break
        else:
            continue
    fitting.sort(key=lambda r: r["est_step_seconds"])
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


# ---------------------------------------------------------------------------- text


def format_report(r: dict) -> str:
    b = r["bytes_per_chip"]
    g = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
    if not r.get("compiled", True):
        return "\n".join([
            f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
            f"{mesh}, remat={r['remat']}, grad_accum_steps={r['grad_accum_steps']}",
            f"DOES NOT FIT: XLA refused to compile it ({r['xla_error']})",
            f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])}, temporaries "
            f"{g(b['temp'])} (XLA's figure) of {g(r['hbm_bytes_per_chip'])} HBM. Try "
            "--search, or --set model.remat=full / train.grad_accum_steps=K / mesh.fsdp=-1."])
    lines = [
        f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
        f"{mesh}, remat={r['remat']}, grad_accum_steps={r['grad_accum_steps']}, "
        f"batch {r['batch_size']} ({r['tokens_per_step']} tokens)",
        f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])} (arguments "
        f"{g(b['arguments'])}), temporaries {g(b['temp'])}, total {g(b['total'])} of "
        f"{g(r['hbm_bytes_per_chip'])} HBM",
        ("FITS" if r["fits"] else "DOES NOT FIT") + f": headroom {g(r['headroom_bytes'])}",
        f"FLOPs per chip: compiled {r['flops_per_chip']:.3g} (cost_analysis "
        f"{r['cost_analysis_flops_per_chip']:.3g} x loop scale {r['loop_scale']:.3g}); model "
        f"{r['model_flops_per_chip']:.3g} (3 x forward matmuls), with remat recompute "
        f"{r['model_flops_with_remat_per_chip']:.3g}",
        f"bytes accessed per chip {r['bytes_accessed_per_chip']:.3g}",
        "collectives per chip: " + (", ".join(
            f"{k} {v['count']}x {v['bytes'] / 1e6:.1f} MB" for k, v in
            sorted(r["collectives"].items())) or "none"),
        "roofline: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                 r["roofline_seconds"].items())
        + f" -> est. step {r['est_step_seconds'] * 1e3:.2f} ms ({r['bound']}-bound), "
        f"{r['est_tokens_per_s']:.3g} tokens/s, MFU {r['est_mfu']:.1%}",
        f"compiled in {r['compile_seconds']:.0f} s",
    ]
    return "\n".join(lines)
