"""Compile a config's real train step for a TPU slice on any host (no TPU needed), and say
whether it fits the chips' HBM and how fast it should run.

Path: topology name -> abstract TPU devices (jax.experimental.topologies, needs libtpu) -> the
config's (data, fsdp, tensor) mesh over them -> trainer.make_train_step(...).jitted traced with
ShapeDtypeStructs carrying NamedShardings -> lower -> compile -> memory_analysis (per chip),
cost_analysis and the compiled HLO (collectives) -> a roofline from CHIPS. `--search` repeats it
over meshes, remat policies and micro-batch counts. (MaxText's train_compile.py is the
precedent.)

Loops: XLA's cost_analysis counts a while loop's body once, and the compiled TPU step has
loops the model does not: besides scanned layers and gradient accumulation, the collective
matmuls XLA makes of fsdp-sharded matmuls (an all-gather split into one step per shard pair).
So FLOPs, collectives and the loop scaling of bytes come from the compiled HLO itself
(`hlo_costs`): every convolution and dot counted as XLA's cost analysis counts it, every loop
body times its trip count (read from the loop's counter: start, step and bound).
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
from t5lite.monitor import flops as flops_lib

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
# a shape and its layout, if any: bf16[8,512]{1,0:T(8,128)(2,1)S(1)}
_SHAPE_LAYOUT = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\](?:\{([^}]*)\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def _shape_bytes(text: str) -> int:
    return sum(_DTYPE_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims in _SHAPE.findall(text))


def _hbm_bytes(text: str) -> int:
    """Bytes of the arrays in ``text`` that live in HBM. A compiled TPU layout names the
    memory space of anything elsewhere: ``S(1)`` is VMEM (the on-chip scratchpad XLA's
    memory-space assignment prefetches operands into), ``S(2)`` sync flags, ``S(6)`` SMEM
    scalars; reads and writes there cost no HBM bandwidth."""
    return sum(_DTYPE_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims, layout in _SHAPE_LAYOUT.findall(text or "")
               if _SPACE.search(layout) is None or _SPACE.search(layout).group(1) == "0")


def _parse_hlo(hlo_text: str):
    """-> ({computation: [instruction lines]}, entry name, {instruction: result text})."""
    comps, entry, cur = {}, None, None
    for line in hlo_text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            cur = comps.setdefault(m.group(1), [])
            if line.startswith("ENTRY"):
                entry = m.group(1)
        elif cur is not None and line.startswith(" "):
            cur.append(line)
    results = {}  # compiled HLO names operands without their shapes: look them up here
    for lines in comps.values():
        for line in lines:
            d = _DEF.match(line)
            if d:
                results[d.group(1)] = d.group(2)
    return comps, entry, results


_DEF = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\(")
# instructions that move no data of their own (views, tuples, control flow: its bodies count)
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
               "conditional", "call", "after-all", "partition-id", "replica-id", "copy-done",
               "opt-barrier", "async-done", "add-dependency", "domain"}


def _trip_count(comps, while_line: str, caller: list) -> int:
    """Iterations of an HLO while loop: its condition compares a loop-carried counter (tuple
    element i) against a constant N; the body adds a constant step to element i, and the
    caller's initial tuple holds its start (XLA's collective-matmul loops count 0, 2, 4 ...
    in pairs). ceil((N - start) / step); a loop not of this form: its condition's largest
    integer constant."""
    cond = re.search(r"condition=%?([\w.\-]+)", while_line).group(1)
    body = re.search(r"body=%?([\w.\-]+)", while_line).group(1)
    consts = _constants(comps.get(cond, []))
    index = {}
    for line in comps.get(cond, []):
        d = _DEF.match(line)
        if d and d.group(3) == "get-tuple-element":
            index[d.group(1)] = int(re.search(r"index=(\d+)", line).group(1))
    for line in comps.get(cond, []):
        d = _DEF.match(line)
        if not d or d.group(3) != "compare":
            continue
        a, b = _operands(line, d.end())[:2]
        direction = re.search(r"direction=(\w+)", line).group(1)
        if a in index and b in consts and direction in ("LT", "LE", "NE"):
            i, limit = index[a], consts[b] + (direction == "LE")
        elif b in index and a in consts and direction in ("GT", "GE", "NE"):
            i, limit = index[b], consts[a] + (direction == "GE")
        else:
            continue
        step = _tuple_step(comps.get(body, []), i)
        start = _tuple_start(caller, while_line, i)
        return max(1, -(-(limit - start) // step))
    return max(consts.values(), default=1)  # a counter we cannot trace: its bound


def _constants(lines) -> dict:
    out = {}
    for line in lines:
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = [su](?:8|16|32|64)\[\]\S* constant\((-?\d+)\)",
                     line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _tuple_step(body: list, i: int) -> int:
    defs = {}
    for line in body:
        d = _DEF.match(line)
        if d:
            defs[d.group(1)] = (d.group(3), _operands(line, d.end()))
    consts = _constants(body)
    root = next((_DEF.match(line) for line in body if line.lstrip().startswith("ROOT")), None)
    if not root or defs[root.group(1)][0] != "tuple" or i >= len(defs[root.group(1)][1]):
        return 1
    kind, ops = defs.get(defs[root.group(1)][1][i], ("", []))
    if kind == "add":
        return next((consts[o] for o in ops if o in consts and consts[o] > 0), 1)
    return 1


def _tuple_start(caller: list, while_line: str, i: int) -> int:
    init = re.search(r" while\(%([\w.\-]+)\)", while_line)
    consts = _constants(caller)
    for line in caller:
        d = _DEF.match(line)
        if d and init and d.group(1) == init.group(1) and d.group(3) == "tuple":
            ops = _operands(line, d.end())
            return consts.get(ops[i], 0) if i < len(ops) else 0
    return 0


def _operands(line: str, op_end: int) -> list:
    args = line[op_end:]
    depth, i = 1, 0
    while i < len(args) and depth:  # up to the call's closing parenthesis
        depth += {"(": 1, ")": -1}.get(args[i], 0)
        i += 1
    return re.findall(r"%([\w.\-]+)", args[:i])


def _dims(text: str) -> list:
    m = _SHAPE.search(text or "")
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _conv_flops(line: str, results: dict, operands: list, out_text: str) -> int:
    """2 x the multiply-adds of an HLO convolution whose inputs are in bounds, the count of
    XLA's HloCostAnalysis (the TPU compiler writes batched matmuls as convolutions with
    dilated or padded windows: most window positions there fall outside the input)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", line)
    lhs, rhs = (_dims(results.get(o)) for o in operands[:2])
    out = _dims(out_text)
    if not labels or not lhs or not rhs or not out:
        return 0
    li, ki, oi = labels.groups()
    window = re.search(r"window=\{([^}]*)\}", line)
    win = dict(re.findall(r"(\w+)=([\d_x\-]+)", window.group(1) if window else ""))
    n = len(li) - 2

    def field(name, default, k):
        v = win.get(name)
        return int(v.split("x")[k]) if v else default

    counts = []
    for s in range(n):
        in_n, k_n, out_n = lhs[li.index(str(s))], rhs[ki.index(str(s))], out[oi.index(str(s))]
        stride, wdil, bdil = field("stride", 1, s), field("rhs_dilate", 1, s), field(
            "lhs_dilate", 1, s)
        pad_lo = int(win["pad"].split("x")[s].split("_")[0]) if "pad" in win else 0
        valid = 0
        for kk in range(k_n):
            for o in range(out_n):
                u = o * stride - pad_lo + kk * wdil
                if u % bdil == 0 and 0 <= u // bdil < in_n:
                    valid += 1
        counts.append(valid)
    groups = re.search(r"feature_group_count=(\d+)", line)
    bgroups = re.search(r"batch_group_count=(\d+)", line)
    fma = (lhs[li.index("f")] // (int(groups.group(1)) if groups else 1)
           * out[oi.index("f")] * lhs[li.index("b")] // (int(bgroups.group(1)) if bgroups else 1)
           * math.prod(counts))
    return 2 * fma


def _dot_flops(line: str, results: dict, operands: list, out_text: str) -> int:
    lhs = _dims(results.get(operands[0])) if operands else []
    c = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
    k = math.prod(lhs[int(i)] for i in c.group(1).split(",") if i) if c and lhs else 1
    return 2 * math.prod(_dims(out_text)) * k


def _sliced_read(comps, fused: str, index: int, results: dict, depth: int = 0):
    """Bytes fused computation ``fused`` reads of its parameter ``index`` when every use is a
    dynamic-slice, directly or inside nested fusions (a scanned layer's backward reads its
    slice of the stacked [layers, ...] residuals this way); None when something reads it
    whole."""
    parsed = [(d, line) for line in comps.get(fused, []) if (d := _DEF.match(line))]
    param = next((d.group(1) for d, line in parsed if d.group(3) == "parameter" and int(
        re.search(r"parameter\((\d+)\)", line).group(1)) == index), None)
    uses = [(d.group(3), d.group(1), line, ops) for d, line in parsed
            if param in (ops := _operands(line, d.end()))]
    if param is None or not uses or depth > 8:
        return None
    total = 0
    for kind, name, line, ops in uses:
        called = re.search(r"\bcalls=%?([\w.\-]+)", line)
        if kind == "dynamic-slice" and ops[0] == param:
            total += _shape_bytes(results.get(name, ""))
        elif kind == "fusion" and called:
            inner = [_sliced_read(comps, called.group(1), i, results, depth + 1)
                     for i, o in enumerate(ops) if o == param]
            if any(n is None for n in inner):
                return None
            total += sum(inner)
        else:
            return None
    return total


def _fusion_traffic(comps, fused: str, operands: list, results: dict, out_text: str) -> int:
    """HBM bytes a fusion reads and writes: operands and results in VMEM count nothing; a
    parameter read only through dynamic-slices (also inside nested fusions) counts as those
    slices, and a root dynamic-update-slice into a parameter (in place) as its update (the
    scanned layers' stacked weights and saved activations)."""
    lines = comps.get(fused, [])
    params, root_dus = {}, {}
    defs = {}
    for line in lines:
        d = _DEF.match(line)
        if not d:
            continue
        name, kind = d.group(1), d.group(3)
        defs[name] = (kind, line, d.end())
        if kind == "parameter":
            params[int(re.search(r"parameter\((\d+)\)", line).group(1))] = name
    root = next((_DEF.match(line) for line in lines if line.lstrip().startswith("ROOT")), None)
    roots = [root.group(1)] if root else []
    if root and root.group(3) == "tuple":
        roots = _operands(defs[root.group(1)][1], defs[root.group(1)][2])
    written = _hbm_bytes(out_text)
    for r in roots:
        kind, line, end = defs.get(r, ("", "", 0))
        if kind == "dynamic-update-slice" and _hbm_bytes(results.get(r, "")):
            buf, upd = _operands(line, end)[:2]
            root_dus[buf] = _shape_bytes(results.get(upd, ""))
            written += root_dus[buf] - _shape_bytes(results.get(r, ""))
    read = 0
    for i, outer in enumerate(operands):
        if params.get(i) in root_dus or not _hbm_bytes(results.get(outer, "")):
            continue  # updated in place (the update is counted as written), or in VMEM
        sliced = _sliced_read(comps, fused, i, results)
        read += sliced if sliced is not None else _hbm_bytes(results.get(outer, ""))
    return read + max(written, 0)


def hlo_costs(hlo_text: str, chip: "Chip | None" = None) -> dict:
    """Per chip for one step of a compiled HLO module, every while loop's body times its trip
    count (`_trip_count`: the loop counter's start, step and bound; XLA's cost_analysis counts
    a body once, and the TPU compiler adds loops of its own: scanned layers, gradient accumulation,
    and the collective matmuls that split an all-gathered matmul into one step per shard),
    a conditional's costliest branch:
    - ``matmul_flops``: 2 x multiply-adds of every convolution and dot, with XLA's counting of
      in-bounds window positions;
    - ``bytes``: HBM bytes read and written by the top-level instructions (fusions as one
      instruction, dynamic slices and in-place updates as their slices; operands and results
      that the layout places in VMEM or SMEM count nothing, a prefetch into VMEM counts its
      HBM read once);
    - ``op_seconds`` (with ``chip``): the sum over top-level instructions of each one's own
      roofline, max(its matmul FLOPs / peak, its HBM bytes / bandwidth): the TensorCore runs
      them one after another, so a memory-bound fusion cannot borrow a compute-bound one's
      idle bandwidth (collectives and prefetches are asynchronous DMAs and are not in it;
      their bytes are in ``bytes``); ``op_seconds_hbm_bound``: the part of it spent in
      instructions whose bytes take longer than their FLOPs;
    - ``collectives``: {kind: {"count", "bytes"}}: the larger of an op's operands and result
      (an all-gather's gathered result, a reduce-scatter's full operand); an all-reduce counts
      twice (reduce-scatter + all-gather);
    - ``matmul_flops_once`` / ``bytes_once``: the same with every loop body counted once (what
      cost_analysis sees)."""
    comps, entry, results = _parse_hlo(hlo_text)
    memo = {}

    def add(into, other, k=1):
        for key, v in other.items():
            into[key] = into.get(key, 0) + k * v

    def cost(name, fused):
        if (name, fused) in memo:
            return memo[name, fused]
        memo[name, fused] = {}
        total = {}
        for line in comps.get(name, []):
            d = _DEF.match(line)
            if not d:
                continue
            out_text, kind = d.group(2), d.group(3)
            ops = _operands(line, d.end())
            op_flops = 0
            if kind == "convolution":
                op_flops = _conv_flops(line, results, ops, out_text)
            elif kind == "dot":
                op_flops = _dot_flops(line, results, ops, out_text)
            if op_flops:
                add(total, {"matmul_flops": op_flops, "matmul_flops_once": op_flops})
            if kind == "while":
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                n = _trip_count(comps, line, comps.get(name, []))
                sub = cost(body, False)
                add(total, {k: v for k, v in sub.items() if not k.endswith("_once")}, n)
                add(total, {k: v for k, v in sub.items() if k.endswith("_once")})
                continue
            b = _BRANCHES.search(line)
            if kind == "conditional" and b:
                subs = [cost(c.strip().lstrip("%"), False) for c in b.group(1).split(",")]
                for key in {k for s in subs for k in s}:
                    total[key] = total.get(key, 0) + max(s.get(key, 0) for s in subs)
                continue
            called = re.search(r"\bcalls=%?([\w.\-]+)", line)
            if called:
                sub = cost(called.group(1), kind == "fusion" or fused)
                add(total, sub)
                if kind == "fusion":
                    op_flops += sub.get("matmul_flops", 0)
            if fused:
                continue
            base = kind[:-6] if kind.endswith("-start") else kind
            if base in _COLLECTIVES and not kind.endswith("-done"):
                result = _shape_bytes(out_text)
                operand_bytes = sum(_shape_bytes(results.get(o, "")) for o in ops)
                nbytes = max(result, operand_bytes)
                if kind.endswith("-start") and out_text.startswith("("):
                    nbytes = max(_shape_bytes(s) for s in _split_tuple(out_text))
                nbytes *= 2 if base == "all-reduce" else 1
                add(total, {f"coll:{base}:count": 1, f"coll:{base}:bytes": nbytes})
            if kind in _NO_TRAFFIC or kind.endswith("-done"):
                continue
            if kind == "fusion" and called:
                nbytes = _fusion_traffic(comps, called.group(1), ops, results, out_text)
            elif kind == "copy-start":  # (destination, source alias, context): a prefetch
                # into VMEM reads its source from HBM, an eviction writes its destination
                first = _SHAPE_LAYOUT.search(out_text)
                nbytes = (_hbm_bytes(first.group(0) if first else "")
                          + sum(_hbm_bytes(results.get(o, "")) for o in ops))
            elif kind == "dynamic-slice":
                nbytes = _hbm_bytes(out_text) + (_shape_bytes(out_text) if ops and _hbm_bytes(
                    results.get(ops[0], "")) else 0)
            elif kind == "dynamic-update-slice" and len(ops) > 1:
                nbytes = (_hbm_bytes(results.get(ops[1], ""))
                          + (_shape_bytes(results.get(ops[1], "")) if _hbm_bytes(out_text)
                             else 0))
            else:
                nbytes = _hbm_bytes(out_text) + sum(_hbm_bytes(results.get(o, ""))
                                                    for o in ops)
            add(total, {"bytes": nbytes, "bytes_once": nbytes})
            if chip is not None and base not in _COLLECTIVES and kind != "copy-start":
                t_flops, t_hbm = op_flops / chip.peak_flops, nbytes / chip.hbm_bw
                add(total, {"op_seconds": max(t_flops, t_hbm),
                            "op_seconds_hbm_bound": t_hbm if t_hbm > t_flops else 0.0})
        memo[name, fused] = total
        return total

    c = cost(entry, False)
    coll = {}
    for key, v in c.items():
        if key.startswith("coll:"):
            _, kind, what = key.split(":")
            coll.setdefault(kind, {"count": 0, "bytes": 0})[what] = v
    return {"matmul_flops": c.get("matmul_flops", 0), "bytes": c.get("bytes", 0),
            "matmul_flops_once": c.get("matmul_flops_once", 0),
            "bytes_once": c.get("bytes_once", 0), "op_seconds": c.get("op_seconds", 0.0),
            "op_seconds_hbm_bound": c.get("op_seconds_hbm_bound", 0.0), "collectives": coll}


def hlo_collectives(hlo_text: str) -> dict:
    """{kind: {"count", "bytes"}} per chip for one step (see hlo_costs)."""
    return hlo_costs(hlo_text)["collectives"]


def _split_tuple(text: str) -> list:
    return [s for s in re.split(r",\s*(?![^\[]*\])", text.strip("()")) if s]


# ---------------------------------------------------------------------------- compile


def _leaf_bytes(tree) -> int:
    """Bytes per chip of a tree of ShapeDtypeStructs with shardings."""
    import jax
    n = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        n += math.prod(shape) * x.dtype.itemsize
    return n


def analytic_bytes(cfg, mesh: dict, params: int, opt_state: int) -> dict:
    """The least per-chip memory the step can live in, from the shapes alone -> {state,
    saved, working, logits, total} bytes. ``params`` / ``opt_state``: per-chip bytes as
    sharded (the compile's arguments).

    - state: parameters + their float32 gradients (sharded as the parameters) + optimizer
      state;
    - saved: what the backward pass needs from the forward, per layer in the compute dtype,
      by remat policy: ``full`` the layer input; ``minimal`` also the named projection outputs
      (q, k, v, attention out, MLP wi / wo); ``none`` every activation the layer's gradient
      reads (norm inputs and outputs, q, k, v, the attention probabilities, the attention
      output, the MLP pre-activations and hidden);
    - working: one layer's activations as with ``none`` (being recomputed or differentiated)
      plus its gathered bf16 weights (fsdp all-gathers one layer at a time);
    - logits: the output layer's logits in float32 and the compute dtype (the loss and its
      gradient read them).
    Tokens per chip divide the batch by data x fsdp; heads and MLP width divide by tensor.
    A lower bound of what XLA allocates: the compiled temporaries add fusion buffers, the
    collectives' landing buffers and prefetch double-buffering."""
    m = cfg.model
    it = 2 if m.dtype == "bfloat16" else 4
    shards = max(mesh.get("data", 1) * mesh.get("fsdp", 1), 1)
    tp = max(mesh.get("tensor", 1), 1)
    seqs = cfg.data.batch_size / shards
    lengths = cfg.data.feature_lengths
    d, hk, h = m.d_model, m.num_heads * m.head_dim / tp, m.num_heads / tp
    f = m.d_ff / tp
    from t5lite.models.layers import GATED
    gated = m.ffn in GATED
    wi = f * (2 if gated else 1)

    def layer(t, s_self, s_cross=0):
        """Per-sequence element counts of one layer on t tokens: (saved by policy, all)."""
        attn = 2 * d + 3 * hk + h * s_self + hk
        mlp = 2 * d + wi + f
        cross = (2 * d + hk + h * s_cross + hk) * t + 2 * hk * s_cross if s_cross else 0
        everything = (attn + mlp) * t + cross
        named = (d + 3 * hk + d + wi + d) * t + (hk + d) * t * bool(s_cross) + (
            2 * hk * s_cross)
        return {"full": d * t, "minimal": named, "none": everything}[m.remat], everything

    arch = m.architecture
    if arch == "encoder_decoder":
        t_in, t_out = lengths.get("inputs", 0), lengths.get("targets", 0)
        stacks = [(m.num_encoder_layers, layer(t_in, t_in)),
                  (m.num_decoder_layers, layer(t_out, t_out, t_in))]
        t_logits = t_out
    else:
        t = lengths.get("inputs", 0) if arch == "encoder_only" else sum(lengths.values())
        n = m.num_encoder_layers if arch == "encoder_only" else m.num_decoder_layers
        stacks = [(n, layer(t, t))]
        t_logits = t
    saved = sum(n * s for n, (s, _) in stacks) * seqs * it
    layer_params = (4 * m.num_heads * m.head_dim * d + (3 if gated else 2) * m.d_ff * d) / tp
    working = max(a for _, (_, a) in stacks) * seqs * it + 2 * layer_params
    logits = seqs * t_logits * m.vocab_size / tp * (4 + it)
    state = 2 * params + opt_state
    parts = {"state": state, "saved": saved, "working": working, "logits": logits}
    return dict({k: int(v) for k, v in parts.items()}, total=int(sum(parts.values())))


_CACHE: dict = {}  # (config JSON, topology) -> report: --search revisits configs


def compile_step(cfg, topo: Topology, devices=None, hbm_bytes: int = 0) -> dict:
    """Compile cfg's train step for `topo` -> the report (see CONTRACTS.md, `t5lite compile`).
    `hbm_bytes` (default: the chip's) is what `fits` compares the per-chip total against."""
    from t5lite import config as config_lib
    from t5lite.train import partitioning
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

    from t5lite.models import dummy_batch
    from t5lite.train import partitioning, trainer

    abstract, shardings, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    trainable = jax.tree.map(lambda _: True, shardings.params) if differentiate_all else None
    step = trainer.make_train_step(cfg, model, tx, mesh, shardings, trainable=trainable)
    bsh = partitioning.batch_sharding(mesh)
    host = dummy_batch(cfg.model, cfg.data.batch_size, cfg.data.feature_lengths)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=bsh) for k, v in host.items()}
    with partitioning.activate(mesh):
        return abstract, step.jitted.trace(abstract, batch)


def memory_total(mem) -> int:
    """Per-chip bytes a compiled program needs (its memory_analysis()): the backend's peak
    (arguments, outputs and the temporaries live at once) where it reports one, as libtpu
    does; else arguments + outputs not aliased to (donated) arguments + temporaries.

    On TPU the peak is what the compiler's own HBM check compares (it refuses a program whose
    peak exceeds the chip's HBM and compiles one whose arguments + temp_size_in_bytes exceed
    it: tests/test_compile.py); temp_size_in_bytes is a larger figure than the temporaries
    live at the peak, so the sum overstated every scanned step (bench/RESULTS.md)."""
    peak = getattr(mem, "peak_memory_in_bytes", 0) or 0
    return int(peak) if peak > 0 else _io_bytes(mem) + mem.temp_size_in_bytes


def _io_bytes(mem) -> int:
    """Arguments + outputs not aliased to (donated) arguments."""
    return mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes


def memory_bytes(mem) -> dict:
    """bytes_per_chip's compiled part: arguments, outputs, aliased, temp (the temporaries
    live at the peak: total - arguments - outputs not aliased), xla_temp (XLA's
    temp_size_in_bytes), total (memory_total)."""
    total = memory_total(mem)
    live_io = _io_bytes(mem)
    return {"arguments": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
            "aliased": mem.alias_size_in_bytes, "temp": max(total - live_io, 0),
            "xla_temp": mem.temp_size_in_bytes, "total": total}


def roofline_seconds(hlo: dict, chip: Chip) -> dict:
    """Lower bounds on a step's time from hlo_costs(..., chip): its FLOPs at peak, its HBM
    bytes at full bandwidth, its collectives at full ICI bandwidth, and the sum of its
    instructions' own rooflines (`ops`: they run one after another; collectives overlap them).
    The estimate is the largest."""
    return {"compute": hlo["matmul_flops"] / chip.peak_flops, "hbm": hlo["bytes"] / chip.hbm_bw,
            "ici": sum(c["bytes"] for c in hlo["collectives"].values()) / chip.ici_bw,
            "ops": hlo["op_seconds"]}


def _compile(cfg, topo: Topology, devices=None) -> dict:
    import time

    import jax

    from t5lite.models import build_model, layers, peft
    from t5lite.train import partitioning, trainer

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
    full = flops_lib.jaxpr_matmul_flops(traced.jaxpr.jaxpr)
    # FLOPs, HBM bytes and the per-instruction roofline with every while loop's trip count,
    # read from the compiled HLO (XLA's cost_analysis counts a loop body once, and on TPU it
    # adds loops of its own: the collective matmuls of fsdp; its "bytes accessed" also counts
    # operands that memory-space assignment placed in VMEM). FLOPs: the HLO's convolutions
    # and dots, counted exactly.
    chip = topo.chip
    hlo = hlo_costs(compiled.as_text(), chip)
    flops = float(hlo["matmul_flops"])
    loop_scale = hlo["matmul_flops"] / max(hlo["matmul_flops_once"], 1)
    bytes_accessed = float(hlo["bytes"])
    xla_bytes = float(cost.get("bytes accessed", 0.0)) * hlo["bytes"] / max(hlo["bytes_once"], 1)
    coll = hlo["collectives"]
    coll_bytes = sum(c["bytes"] for c in coll.values())
    params = _leaf_bytes(abstract.params)
    opt = _leaf_bytes(abstract.opt_state)
    mem_bytes = memory_bytes(mem)
    total = mem_bytes["total"]
    times = roofline_seconds(hlo, chip)
    est = max(times.values())
    model_per_chip = model_flops / chips
    floor = analytic_bytes(cfg, dict(mesh.shape), params, opt)
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
        "tokens_per_step": flops_lib.tokens_per_step(cfg),
        "bytes_per_chip": dict({"params": params, "opt_state": opt}, **mem_bytes),
        "analytic_bytes_per_chip": floor,
        "total_over_analytic": total / max(floor["total"], 1),
        "flops_per_chip": flops,
        "model_flops_per_chip": model_per_chip,
        "model_flops_with_remat_per_chip": full / chips,
        "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
        "loop_scale": loop_scale,
        "bytes_accessed_per_chip": bytes_accessed,
        "xla_bytes_accessed_per_chip": xla_bytes,
        "collectives": coll,
        "collective_bytes_per_chip": coll_bytes,
        "roofline_seconds": times,
        "bound": _bound(times, hlo["op_seconds_hbm_bound"]),
        "est_step_seconds": est,
        "est_tokens_per_s": flops_lib.tokens_per_step(cfg) / est if est else 0.0,
        "est_mfu": model_per_chip / (est * chip.peak_flops) if est else 0.0,
        "compile_seconds": seconds,
    }


def _bound(times: dict, ops_hbm_bound: float) -> str:
    """What limits the estimated step: the largest term, the per-instruction sum read as
    "hbm" or "compute" by where most of its time goes."""
    key = max(times, key=times.get)
    if key != "ops":
        return key
    return "hbm" if ops_hbm_bound > times["ops"] / 2 else "compute"


def _out_of_memory(cfg, topo, mesh, abstract, model_flops, msg, seconds) -> dict:
    """XLA refuses to compile a program whose peak exceeds the chip's HBM: report it as not
    fitting, with the size its message gives ("the total memory required for HLO temporaries
    (X)": X is the peak, arguments included, as memory_total reads it from a program that
    compiles; no FLOPs or time: nothing was compiled)."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    sizes = [float(n) * units[u] for n, u in re.findall(r"([\d.]+)([KMGT])i?B?\b", msg)]
    params, opt = _leaf_bytes(abstract.params), _leaf_bytes(abstract.opt_state)
    total = max(int(sizes[0]) if sizes else 0, params + opt)
    temp = total - params - opt
    return {"config": cfg.name, "topology": topo.name, "jax_topology": topo.jax_name,
            "chip": topo.chip.name, "chips": mesh.size, "mesh": dict(mesh.shape),
            "remat": cfg.model.remat, "grad_accum_steps": cfg.train.grad_accum_steps,
            "batch_size": cfg.data.batch_size, "tokens_per_step": flops_lib.tokens_per_step(cfg),
            "compiled": False, "xla_error": msg.strip().splitlines()[0][:300],
            "bytes_per_chip": {"params": params, "opt_state": opt, "arguments": params + opt,
                               "outputs": 0, "aliased": 0, "temp": temp, "xla_temp": None,
                               "total": total},
            "flops_per_chip": None, "model_flops_per_chip": model_flops / mesh.size,
            "model_flops_with_remat_per_chip": None, "cost_analysis_flops_per_chip": None,
            "loop_scale": None, "bytes_accessed_per_chip": None,
            "xla_bytes_accessed_per_chip": None,
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

    from t5lite.eval import decoding
    from t5lite.models import build_model, layers, peft
    from t5lite.train import partitioning, trainer

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
    mem_bytes = memory_bytes(mem)
    total = mem_bytes["total"]
    hbm = hbm_bytes or topo.chip.hbm_bytes
    hlo = hlo_costs(compiled.as_text())
    return {"config": cfg.name, "program": "decode", "method": cfg.decode.method,
            "beams": beams, "max_length": cfg.decode.max_length, "topology": topo.name,
            "jax_topology": topo.jax_name, "chip": topo.chip.name, "chips": mesh.size,
            "mesh": dict(mesh.shape), "batch_size": b, "input_length": n_in,
            "fits": total <= hbm, "hbm_bytes_per_chip": hbm, "headroom_bytes": hbm - total,
            "bytes_per_chip": dict({"params": _leaf_bytes(abstract.params)}, **mem_bytes),
            "flops_per_chip": float(hlo["matmul_flops"]),
            "cost_analysis_flops_per_chip": float(cost.get("flops", 0.0)),
            "collectives": hlo["collectives"],
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
        f"FLOPs per chip: {r['flops_per_chip']:.3g} (the HLO's matmuls, the token loop x its "
        f"trip count; cost_analysis, loops once: {r['cost_analysis_flops_per_chip']:.3g})",
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
            f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])}, total "
            f"{g(b['total'])} (XLA's figure) of {g(r['hbm_bytes_per_chip'])} HBM. Try "
            "--search, or --set model.remat=full / train.grad_accum_steps=K / mesh.fsdp=-1."])
    lines = [
        f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
        f"{mesh}, remat={r['remat']}, grad_accum_steps={r['grad_accum_steps']}, "
        f"batch {r['batch_size']} ({r['tokens_per_step']} tokens)",
        f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])} (arguments "
        f"{g(b['arguments'])}), temporaries {g(b['temp'])}, total {g(b['total'])} of "
        f"{g(r['hbm_bytes_per_chip'])} HBM",
        ("FITS" if r["fits"] else "DOES NOT FIT") + f": headroom {g(r['headroom_bytes'])}",
        f"FLOPs per chip: compiled {r['flops_per_chip']:.3g} (the HLO's matmuls, loops x their "
        f"trip counts; cost_analysis counts {r['cost_analysis_flops_per_chip']:.3g}); model "
        f"{r['model_flops_per_chip']:.3g} (3 x forward matmuls), with remat recompute "
        f"{r['model_flops_with_remat_per_chip']:.3g}",
        f"HBM bytes per chip {r['bytes_accessed_per_chip']:.3g} (VMEM-resident operands "
        f"excluded; XLA's cost_analysis, loops scaled: {r['xla_bytes_accessed_per_chip']:.3g})",
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
