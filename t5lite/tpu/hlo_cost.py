"""Costs of one step of a compiled HLO module, per chip, read from its text: matmul FLOPs, HBM
bytes, collectives, and a per-instruction roofline (`hlo_costs`); lower bounds on the step's
time from them (`roofline_seconds`).

Loops: XLA's cost_analysis counts a while loop's body once, and the compiled TPU step has
loops the model does not: besides scanned layers and gradient accumulation, the collective
matmuls XLA makes of fsdp-sharded matmuls (an all-gather split into one step per shard pair).
So FLOPs, collectives and the loop scaling of bytes come from the compiled HLO itself: every
convolution and dot counted as XLA's cost analysis counts it, every loop body times its trip
count (read from the loop's counter: start, step and bound).
"""

from __future__ import annotations

import math
import re

from t5lite.tpu.hlo_loops import DEF as _DEF, operands as _operands, trip_count as _trip_count

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
# a Pallas kernel's own statement of its cost (pl.CostEstimate) in its custom call's config
_KERNEL_COST = re.compile(r'"cost_estimate":\{"flops":"?(\d+)"?.*?"bytes_accessed":"?(\d+)"?')


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


# instructions that move no data of their own (views, tuples, control flow: its bodies count)
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
               "conditional", "call", "after-all", "partition-id", "replica-id", "copy-done",
               "opt-barrier", "async-done", "add-dependency", "domain"}


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
    side = _collective_side(comps, fused, defs, root)
    if root and root.group(3) in _PASS_THROUGH:
        roots = _operands(defs[root.group(1)][1], defs[root.group(1)][2])
    written = (sum(_hbm_bytes(results.get(r, "")) for r in roots if r not in side) if side
               else _hbm_bytes(out_text))
    for r in roots:
        kind, line, end = defs.get(r, ("", "", 0))
        if kind == "dynamic-update-slice" and _hbm_bytes(results.get(r, "")):
            buf, upd = _operands(line, end)[:2]
            root_dus[buf] = _shape_bytes(results.get(upd, ""))
            written += root_dus[buf] - _shape_bytes(results.get(r, ""))
    read = 0
    for i, outer in enumerate(operands):
        if (params.get(i) in root_dus or params.get(i) in side
                or not _hbm_bytes(results.get(outer, ""))):
            continue  # updated in place (the update is counted as written), the buffers of
            # a collective the fusion carries, or in VMEM
        sliced = _sliced_read(comps, fused, i, results)
        read += sliced if sliced is not None else _hbm_bytes(results.get(outer, ""))
    return read + max(written, 0)


# roots that hand their operands on unchanged: a tuple, or the custom call that ends an async
# collective fusion's start or done
_PASS_THROUGH = {"tuple", "custom-call"}


def _collective_side(comps, fused: str, defs: dict, root) -> set:
    """Names in fused computation ``fused`` (of an async collective fusion: its start, done or
    a compute fusion carrying it) that only hold the collective's buffers: its result and the
    parameters used by nothing but the collective and the root (the shard in flight, the
    buffer it is gathered into, sync flags). They pass through in place: the collective's
    DMAs move them, not the fusion (a blocking collective's bytes are not an instruction's
    time either). Empty for a fusion without a collective."""
    inner = fused_collective(comps, fused)
    if inner is None or root is None:
        return set()
    coll = next(n for n, (kind, _, _) in defs.items() if kind == inner[0])
    uses = {}
    for name, (kind, line, end) in defs.items():
        for o in _operands(line, end):
            uses.setdefault(o, set()).add(name)
    carriers = {coll} | ({root.group(1)} if root.group(3) in _PASS_THROUGH else set())
    return {coll} | {n for n, (kind, _, _) in defs.items() if kind == "parameter"
                     and uses.get(n) and uses[n] <= carriers}


def fused_collective(comps: dict, fused: str):
    """(kind, result text, operands, channel id) of the collective inside fused computation
    ``fused`` (an async collective fusion's start, done or a compute fusion it runs beside),
    or None."""
    for line in comps.get(fused, []):
        d = _DEF.match(line)
        if d and d.group(3) in _COLLECTIVES:
            channel = re.search(r"channel_id=(\d+)", line)
            return (d.group(3), d.group(2), _operands(line, d.end()),
                    int(channel.group(1)) if channel else -1)
    return None


def _split_tuple(text: str) -> list:
    return [s for s in re.split(r",\s*(?![^\[]*\])", text.strip("()")) if s]


def _add(into: dict, other: dict, times=1) -> None:
    for key, v in other.items():
        into[key] = into.get(key, 0) + times * v


def _collective_bytes(base: str, kind: str, out_text: str, operands: list,
                      results: dict) -> int:
    """The larger of a collective's operands and result (an all-gather's gathered result, a
    reduce-scatter's full operand); an all-reduce twice (reduce-scatter + all-gather)."""
    nbytes = max(_shape_bytes(out_text),
                 sum(_shape_bytes(results.get(o, "")) for o in operands))
    if kind.endswith("-start") and out_text.startswith("("):
        nbytes = max(_shape_bytes(s) for s in _split_tuple(out_text))
    return nbytes * (2 if base == "all-reduce" else 1)


class _ModuleCost:
    """Sums the costs of a parsed HLO module's computations, each computed once (memo) per
    (computation, whether it runs inside a fusion)."""

    def __init__(self, comps: dict, results: dict, chip, category=None):
        self.comps, self.results, self.chip, self.category = comps, results, chip, category
        self.memo = {}
        self.op_seconds = {}  # (computation, instruction) -> its own roofline (step_time reads)
        self.chains = {}  # computation -> channel ids of the collective fusions counted there

    def cost(self, name: str, fused: bool) -> dict:
        if (name, fused) in self.memo:
            return self.memo[name, fused]
        self.memo[name, fused] = {}
        total = {}
        for line in self.comps.get(name, []):
            d = _DEF.match(line)
            if d:
                self._instruction(total, name, line, d, fused)
        self.memo[name, fused] = total
        return total

    def _instruction(self, total: dict, caller: str, line: str, d, fused: bool) -> None:
        """Adds one instruction's costs (with what it calls) to ``total``."""
        out_text, kind = d.group(2), d.group(3)
        ops = _operands(line, d.end())
        op_flops = 0
        if kind == "convolution":
            op_flops = _conv_flops(line, self.results, ops, out_text)
        elif kind == "dot":
            op_flops = _dot_flops(line, self.results, ops, out_text)
        kernel = _KERNEL_COST.search(line) if kind == "custom-call" else None
        if kernel:  # XLA's cost analysis cannot see inside a kernel: count what it declares
            op_flops = int(kernel.group(1))  # (flash attention: analytic, flash_attention.py)
            _add(total, {"kernel_flops": op_flops, "kernel_bytes": int(kernel.group(2))})
        if op_flops:
            _add(total, {"matmul_flops": op_flops, "matmul_flops_once": op_flops})
        if kind == "while":
            self._while(total, caller, line)
            return
        branches = _BRANCHES.search(line)
        if kind == "conditional" and branches:
            self._costliest_branch(total, branches.group(1))
            return
        called = re.search(r"\bcalls=%?([\w.\-]+)", line)
        if called:
            sub = self.cost(called.group(1), kind == "fusion" or fused)
            _add(total, sub)
            if kind == "fusion":
                op_flops += sub.get("matmul_flops", 0)
        if fused:
            return
        base = kind[:-6] if kind.endswith("-start") else kind
        if base in _COLLECTIVES and not kind.endswith("-done"):
            nbytes = _collective_bytes(base, kind, out_text, ops, self.results)
            _add(total, {f"coll:{base}:count": 1, f"coll:{base}:bytes": nbytes})
        inner = fused_collective(self.comps, called.group(1)) if kind == "fusion" and called \
            else None
        if inner and inner[3] not in self.chains.setdefault(caller, set()):
            # an async collective fusion: start, the compute fusions it runs beside and done
            # each hold the collective (one channel id); it moves its bytes once
            self.chains[caller].add(inner[3])
            nbytes = _collective_bytes(inner[0], inner[0], inner[1], inner[2], self.results)
            _add(total, {f"coll:{inner[0]}:count": 1, f"coll:{inner[0]}:bytes": nbytes})
            # its HBM reads and writes, once, as a blocking one's (the fusions that carry it
            # count only their own compute's: _collective_side)
            hbm = _hbm_bytes(inner[1]) + sum(_hbm_bytes(self.results.get(o, ""))
                                             for o in inner[2])
            _add(total, {"bytes": hbm, "bytes_once": hbm})
            if self.category:
                _add(total, {f"by:{self.category(line, inner[0])}": hbm})
        if kind in _NO_TRAFFIC or kind.endswith("-done"):
            return
        nbytes = int(kernel.group(2)) if kernel else self._traffic(kind, called, ops, out_text)
        _add(total, {"bytes": nbytes, "bytes_once": nbytes})
        if self.category:
            _add(total, {f"by:{self.category(line, kind)}": nbytes})
        if self.chip is not None and base not in _COLLECTIVES and kind != "copy-start":
            t_flops, t_hbm = op_flops / self.chip.peak_flops, nbytes / self.chip.hbm_bw
            self.op_seconds[caller, d.group(1)] = max(t_flops, t_hbm)
            _add(total, {"op_seconds": max(t_flops, t_hbm),
                         "op_seconds_hbm_bound": t_hbm if t_hbm > t_flops else 0.0})

    def _while(self, total: dict, caller: str, line: str) -> None:
        """A loop's body times its trip count (the ``_once`` keys: once)."""
        body = re.search(r"body=%?([\w.\-]+)", line).group(1)
        trips = _trip_count(self.comps, line, self.comps.get(caller, []))
        sub = self.cost(body, False)
        _add(total, {k: v for k, v in sub.items() if not k.endswith("_once")}, trips)
        _add(total, {k: v for k, v in sub.items() if k.endswith("_once")})

    def _costliest_branch(self, total: dict, branch_names: str) -> None:
        subs = [self.cost(c.strip().lstrip("%"), False) for c in branch_names.split(",")]
        for key in {k for s in subs for k in s}:
            total[key] = total.get(key, 0) + max(s.get(key, 0) for s in subs)

    def _traffic(self, kind: str, called, ops: list, out_text: str) -> int:
        """HBM bytes one top-level instruction reads and writes."""
        results = self.results
        if kind == "fusion" and called:
            return _fusion_traffic(self.comps, called.group(1), ops, results, out_text)
        if kind == "copy-start":  # (destination, source alias, context): a prefetch into
            # VMEM reads its source from HBM, an eviction writes its destination
            first = _SHAPE_LAYOUT.search(out_text)
            return (_hbm_bytes(first.group(0) if first else "")
                    + sum(_hbm_bytes(results.get(o, "")) for o in ops))
        if kind == "dynamic-slice":
            return _hbm_bytes(out_text) + (_shape_bytes(out_text) if ops and _hbm_bytes(
                results.get(ops[0], "")) else 0)
        if kind == "dynamic-update-slice" and len(ops) > 1:
            return (_hbm_bytes(results.get(ops[1], ""))
                    + (_shape_bytes(results.get(ops[1], "")) if _hbm_bytes(out_text) else 0))
        return _hbm_bytes(out_text) + sum(_hbm_bytes(results.get(o, "")) for o in ops)


def hlo_costs(hlo_text: str, chip=None, category=None) -> dict:
    """Per chip for one step of a compiled HLO module, every while loop's body times its trip
    count (hlo_loops.trip_count: the loop counter's start, step and bound; XLA's cost_analysis
    counts a body once, and the TPU compiler adds loops of its own: scanned layers, gradient
    accumulation, and the collective matmuls that split an all-gathered matmul into one step
    per shard), a conditional's costliest branch:
    - ``matmul_flops``: 2 x multiply-adds of every convolution and dot, with XLA's counting of
      in-bounds window positions;
    - ``bytes``: HBM bytes read and written by the top-level instructions (fusions as one
      instruction, dynamic slices and in-place updates as their slices; operands and results
      that the layout places in VMEM or SMEM count nothing, a prefetch into VMEM counts its
      HBM read once);
    - ``op_seconds`` (with ``chip``, a topology.Chip): the sum over top-level instructions of
      each one's own roofline, max(its matmul FLOPs / peak, its HBM bytes / bandwidth): the
      TensorCore runs them one after another, so a memory-bound fusion cannot borrow a
      compute-bound one's idle bandwidth (collectives and prefetches are asynchronous DMAs
      and are not in it; their bytes are in ``bytes``); ``op_seconds_hbm_bound``: the part
      of it spent in instructions whose bytes take longer than their FLOPs;
    - ``collectives``: {kind: {"count", "bytes"}}: the larger of an op's operands and result
      (an all-gather's gathered result, a reduce-scatter's full operand); an all-reduce counts
      twice (reduce-scatter + all-gather);
    - ``matmul_flops_once`` / ``bytes_once``: the same with every loop body counted once (what
      cost_analysis sees);
    - ``kernel_flops`` / ``kernel_bytes``: the part of ``matmul_flops`` / ``bytes`` that Pallas
      kernels declare for themselves (their custom calls' cost estimates, e.g. flash
      attention's analytic count), included above;
    - ``bytes_by`` (only with ``category``, a function of a top-level instruction's HLO line and
      its kind (an async collective fusion's: the collective's) -> a name): ``bytes`` split by
      those names (bench/hlo_bytes_diff.py compares two programs' bytes by where their
      metadata says they come from)."""
    comps, entry, results = _parse_hlo(hlo_text)
    c = _ModuleCost(comps, results, chip, category).cost(entry, False)
    coll = {}
    for key, v in c.items():
        if key.startswith("coll:"):
            _, kind, what = key.split(":")
            coll.setdefault(kind, {"count": 0, "bytes": 0})[what] = v
    return {"matmul_flops": c.get("matmul_flops", 0), "bytes": c.get("bytes", 0),
            "matmul_flops_once": c.get("matmul_flops_once", 0),
            "bytes_once": c.get("bytes_once", 0), "op_seconds": c.get("op_seconds", 0.0),
            "op_seconds_hbm_bound": c.get("op_seconds_hbm_bound", 0.0), "collectives": coll,
            "kernel_flops": c.get("kernel_flops", 0), "kernel_bytes": c.get("kernel_bytes", 0),
            **({"bytes_by": {k[3:]: v for k, v in c.items() if k.startswith("by:")}}
               if category else {})}


def hlo_collectives(hlo_text: str) -> dict:
    """{kind: {"count", "bytes"}} per chip for one step (see hlo_costs)."""
    return hlo_costs(hlo_text)["collectives"]


def roofline_seconds(hlo: dict, chip) -> dict:
    """Lower bounds on a step's time from hlo_costs(..., chip): its FLOPs at peak, its HBM
    bytes at full bandwidth, its collectives at full ICI bandwidth, and the sum of its
    instructions' own rooflines (`ops`: they run one after another; collectives overlap them).
    The estimate is the largest."""
    return {"compute": hlo["matmul_flops"] / chip.peak_flops, "hbm": hlo["bytes"] / chip.hbm_bw,
            "ici": sum(c["bytes"] for c in hlo["collectives"].values()) / chip.ici_bw,
            "ops": hlo["op_seconds"]}


def roofline_bound(times: dict, ops_hbm_bound: float) -> str:
    """What limits the estimated step: the largest term, the per-instruction sum read as
    "hbm" or "compute" by where most of its time goes."""
    key = max(times, key=times.get)
    if key != "ops":
        return key
    return "hbm" if ops_hbm_bound > times["ops"] / 2 else "compute"
