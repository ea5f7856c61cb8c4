"""Expected step time of a compiled TPU program: what the roofline bound (hlo_cost.
roofline_seconds) leaves out.

The bound divides every collective byte by the chip's whole ICI bandwidth and hides every
collective behind compute. Here the scheduled HLO is replayed instruction by instruction on
one chip (the compiled module is in schedule order, ``is_scheduled=true``):
- compute instructions take their own roofline, one after another (hlo_cost's ``ops`` term);
- a collective moves its bytes over the torus links of the physical dimensions its replica
  group spans (`Torus`): a ring along each dimension, both directions where the dimension
  wraps around, one where it does not, plus a latency per ring step;
- a synchronous collective stops the chip for its whole time; an asynchronous one (an
  ``*-start`` / ``*-done`` pair, or an async collective fusion: the start, the compute
  fusions that carry it and the done share one channel id) runs beside the compute scheduled
  between its start and its done, and the done waits for what is left: the exposed part;
- collectives on the same links queue behind each other;
- a while loop's body is replayed once and counted times its trip count; a conditional's
  costliest branch.
"""

from __future__ import annotations

import dataclasses
import math
import re

from t5lite.tpu import hlo_cost, hlo_loops

# Latency of one ring step of a collective (a hop between neighbouring chips and its
# synchronisation): an assumed microsecond, not a measured figure; it matters only where a
# step has many small collectives (the calibration rows' are large: bench/RESULTS.md).
HOP_SECONDS = 1e-6


@dataclasses.dataclass(frozen=True)
class Torus:
    """A slice's interconnect: chips per physical dimension, whether each wraps around, and
    the one-way bandwidth of one link (bytes/s).

    A chip has two ICI ports per torus dimension (4 on v5e / v6e, 6 on v4 / v5p), and the
    chip table's ICI figure is their bidirectional sum, so one link carries ici_bw / (4 x
    dims) each way (v5p: 100 GB/s; v5e: 50 GB/s). Wraparound: v4 / v5p slices of whole 4x4x4
    cubes are full 3D tori, smaller ones meshes (cloud.google.com/tpu/docs/v5p); v5e / v6e
    slices are 2D meshes without wraparound (v5e's pod bisection bandwidth, 1.6 TB/s over
    16 links of 100 GB/s, is a mesh's)."""
    shape: tuple
    wraps: tuple
    link_bw: float

    @classmethod
    def of(cls, chip, shape) -> "Torus":
        shape = tuple(shape)
        cube = chip.dims == 3 and all(n % 4 == 0 for n in shape)
        wraps = tuple(cube and n > 2 for n in shape)
        return cls(shape, wraps, chip.ici_bw / (4 * max(chip.dims, 1)))


def grid_coords(shape) -> list:
    """Physical coordinates of chips numbered over ``shape`` with the first dimension
    fastest (as TPU device ids count x first)."""
    out = []
    for i in range(math.prod(shape)):
        c, rest = [], i
        for n in shape:
            c.append(rest % n)
            rest //= n
        out.append(tuple(c))
    return out


def replica_group(line: str, n_devices: int) -> list:
    """Device indices of the first replica group of a collective (every group has the same
    shape): explicit ``{{0,1},{2,3}}``, iota ``[G,S]<=[dims]T(perm)`` or the named-mesh form
    ``mesh['axis_0'=8,'axis_1'=2] {'axis_0'}``; no groups means every device."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        axes = re.findall(r"'([\w]+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        varying = set(re.findall(r"'([\w]+)'", m.group(2)))
        strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        group = [0]
        for name, size, stride in zip(names, sizes, strides):
            if name in varying:
                group = [g + j * stride for g in group for j in range(size)]
        return sorted(group)
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        size = int(m.group(2))
        dims = [int(d) for d in m.group(3).split(",")]
        perm = [int(p) for p in m.group(4).split(",")] if m.group(4) else list(range(len(dims)))
        order = _transposed_iota(dims, perm)
        return order[:size]
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m and m.group(1):
        return [int(d) for d in m.group(1).split(",")]
    return list(range(n_devices))


def _transposed_iota(dims: list, perm: list) -> list:
    """iota over ``dims`` transposed by ``perm``, flattened (XLA's iota replica groups)."""
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    shape = [dims[p] for p in perm]
    out = []
    for flat in range(math.prod(shape)):
        idx, rest = [], flat
        for n in reversed(shape):
            idx.append(rest % n)
            rest //= n
        idx.reverse()
        out.append(sum(i * strides[p] for i, p in zip(idx, perm)))
    return out


def collective_seconds(kind: str, nbytes: float, group: list, coords: list,
                       torus: Torus) -> tuple:
    """(seconds, physical dimensions used) of one collective moving ``nbytes`` (hlo_cost's
    count: the larger of operand and result, an all-reduce twice) within ``group``.
    Each chip sends and receives (n-1)/n of it; the dimensions the group spans carry it at
    once, each as a ring (two directions where it wraps, one where it does not); each ring
    step adds HOP_SECONDS. An all-to-all crosses half the ring on average."""
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0, ()
    pts = [coords[g] for g in group if g < len(coords)]
    dims = tuple(d for d in range(len(torus.shape)) if len({p[d] for p in pts}) > 1)
    if not dims:  # devices without coordinates: one ring over the slice's first dimension
        dims = (0,)
    lanes = sum(2 if torus.wraps[d] else 1 for d in dims)
    volume = nbytes * (n - 1) / n
    if kind == "all-to-all":  # a piece crosses a quarter of the ring on average
        volume *= max(1.0, max(len({p[d] for p in pts}) for d in dims) / 4)
    steps = sum(len({p[d] for p in pts}) - 1 for d in dims)
    return volume / (lanes * torus.link_bw) + steps * HOP_SECONDS, dims


class _Replay:
    """Replays a parsed module's computations on one chip (see the module docstring)."""

    def __init__(self, comps, results, op_seconds, torus: Torus, coords: list):
        self.comps, self.results, self.op_seconds = comps, results, op_seconds
        self.torus, self.coords = torus, coords
        self.memo = {}
        self.totals = {"collective": 0.0, "exposed": 0.0, "sync": 0, "async": 0}

    def _collective(self, kind: str, line: str, d, ops) -> tuple:
        """(kind, seconds, dims, channel) of the collective an instruction starts or holds,
        or None."""
        called = re.search(r"\bcalls=%?([\w.\-]+)", line)
        base = kind[:-6] if kind.endswith("-start") else kind
        if kind == "async-start" and called:
            inner = hlo_cost.fused_collective(self.comps, called.group(1))
        elif base in hlo_cost._COLLECTIVES:
            channel = re.search(r"channel_id=(\d+)", line)
            inner = (base, d.group(2), ops, int(channel.group(1)) if channel else -1)
        elif kind == "fusion" and called:
            inner = hlo_cost.fused_collective(self.comps, called.group(1))
        else:
            return None
        if inner is None:
            return None
        ckind, out_text, cops, channel = inner
        nbytes = hlo_cost._collective_bytes(ckind, kind, out_text, cops, self.results)
        src = line if base in hlo_cost._COLLECTIVES else next(
            ln for ln in self.comps[called.group(1)] if f" {ckind}(" in ln)
        seconds, dims = collective_seconds(ckind, nbytes, replica_group(
            src, len(self.coords)), self.coords, self.torus)
        return ckind, seconds, dims, channel

    def run(self, comp: str) -> float:
        """Seconds of one execution of computation ``comp``."""
        if comp in self.memo:
            return self.memo[comp]
        self.memo[comp] = 0.0
        lines = [(ln, d) for ln in self.comps.get(comp, []) if (d := hlo_loops.DEF.match(ln))]
        infos = [self._collective(d.group(3), ln, d, hlo_loops.operands(ln, d.end()))
                 for ln, d in lines]
        first, last = {}, {}  # channel -> index of its first / last fusion here
        for i, ((_, d), info) in enumerate(zip(lines, infos)):
            if info and d.group(3) == "fusion":
                first.setdefault(info[3], i)
                last[info[3]] = i
        # a chain whose done comes first and whose start (a tuple) comes last runs across
        # loop iterations (XLA pipelines a layer's all-gather into the previous one)
        wrapped = {c for c in last if first[c] < last[c] and not lines[first[c]][1].group(2)
                   .startswith("(") and lines[last[c]][1].group(2).startswith("(")}
        clock, free, pending, marks = 0.0, {}, {}, {}
        for i, ((line, d), info) in enumerate(zip(lines, infos)):
            name, kind = d.group(1), d.group(3)
            ops = hlo_loops.operands(line, d.end())
            if kind in ("while", "conditional", "call"):
                clock += self._control(comp, line, kind)
                continue
            clock += self.op_seconds.get((comp, name), 0.0)
            if kind.endswith("-done"):
                end = pending.pop(("op", ops[0]), None) if ops else None
                clock = max(clock, end if end is not None else clock)
                continue
            if info is None:
                continue
            channel = info[3] if kind == "fusion" else None  # plain ones repeat channel ids
            if channel in wrapped:
                if i in (first[channel], last[channel]):
                    marks.setdefault(channel, {})[i == last[channel]] = clock
                continue
            clock = self._issue(name, kind, info[1:3], channel, i, last, clock, free, pending)
        end = max([clock] + list(pending.values()))
        for channel in wrapped:  # covered by the compute after its start and before its done
            seconds = infos[last[channel]][1]
            self.totals["collective"] += seconds
            self.totals["async"] += 1
            cover = end - marks[channel][True] + marks[channel][False]
            end += max(seconds - cover, 0.0)
        self.memo[comp] = end
        return end

    def _issue(self, name, kind, info, channel, i, last, clock, free, pending) -> float:
        """A collective instruction at ``clock`` -> the clock after it: a blocking one waits
        for its links and its time; a start (or an async fusion's first) queues on its links
        and runs on; a fusion carrying it runs on; its done waits for what is left."""
        seconds, dims = info
        key = ("op", name) if kind.endswith("-start") else ("chain", channel)
        if key in pending:  # a fusion carrying the collective, or its done
            return max(clock, pending.pop(key)) if last.get(channel) == i else clock
        begin = max([clock] + [free.get(dim, 0.0) for dim in dims])
        end = begin + seconds
        for dim in dims:
            free[dim] = end
        self.totals["collective"] += seconds
        if kind.endswith("-start") or last.get(channel, i) > i:
            pending[key] = end
            self.totals["async"] += 1
            return clock
        self.totals["sync"] += 1
        return end

    def _control(self, comp: str, line: str, kind: str) -> float:
        if kind == "while":
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            return self.run(body) * hlo_loops.trip_count(self.comps, line, self.comps[comp])
        if kind == "conditional":
            branches = hlo_cost._BRANCHES.search(line)
            names = [c.strip().lstrip("%") for c in branches.group(1).split(",")] \
                if branches else []
            return max((self.run(b) for b in names), default=0.0)
        called = re.search(r"to_apply=%?([\w.\-]+)", line)
        return self.run(called.group(1)) if called else 0.0


def expected_step(hlo_text: str, chip, shape, coords=None) -> dict:
    """The expected step of a compiled module on a slice of ``chip`` with physical ``shape``;
    ``coords``: each device index's physical coordinates (default: grid_coords(shape)).
    -> {seconds, compute_seconds (the instructions' own rooflines, hlo_cost's ``ops``),
    collective_seconds (every collective's time on its links, loops x trip count),
    exposed_seconds (what the step waits for collectives: seconds - compute_seconds),
    sync_collectives / async_collectives (instructions in the module text)}."""
    comps, entry, results = hlo_cost._parse_hlo(hlo_text)
    cost = hlo_cost._ModuleCost(comps, results, chip)
    totals = cost.cost(entry, False)
    coords = [tuple(c) for c in coords] if coords is not None else grid_coords(shape)
    replay = _Replay(comps, results, cost.op_seconds, Torus.of(chip, shape), coords)
    seconds = replay.run(entry)
    collective = _scaled_collective_seconds(replay, comps, entry)
    compute = totals.get("op_seconds", 0.0)
    return {"seconds": seconds, "compute_seconds": compute,
            "collective_seconds": collective, "exposed_seconds": max(seconds - compute, 0.0),
            "sync_collectives": replay.totals["sync"],
            "async_collectives": replay.totals["async"]}


def _scaled_collective_seconds(replay: _Replay, comps, entry: str) -> float:
    """Every collective's link time over one step (loop bodies x trip count)."""
    memo = {}

    def walk(comp: str) -> float:
        if comp in memo:
            return memo[comp]
        memo[comp] = 0.0
        total, seen = 0.0, set()
        for line in comps.get(comp, []):
            d = hlo_loops.DEF.match(line)
            if not d:
                continue
            kind = d.group(3)
            if kind == "while":
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                total += walk(body) * hlo_loops.trip_count(comps, line, comps[comp])
                continue
            if kind.endswith("-done"):
                continue
            info = replay._collective(kind, line, d, hlo_loops.operands(line, d.end()))
            if info and (kind != "fusion" or info[3] not in seen):
                seen.add(info[3] if kind == "fusion" else None)
                total += info[1]
        memo[comp] = total
        return total

    return walk(entry)
