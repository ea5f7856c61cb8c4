"""TPU slices and the one chip table: per-chip HBM, HBM and ICI bandwidth and peak FLOP/s
(also the GPUs' peak FLOP/s, for the training logs' MFU); topology names -> shapes; the
abstract devices of a slice (compile-only: nothing runs on them).

Importing this module is light (no jax, no libtpu): the metrics writers read peak FLOP/s from
it. jax and libtpu load inside `require_libtpu` / `abstract_devices`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

from t5lite.errors import UserError

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip facts of one accelerator (one JAX device = one chip, megacore on v4/v5p).
    Chips `t5lite compile` targets have every field; the rest only their peak FLOP/s (zeros
    elsewhere), which the training logs' MFU reads."""
    name: str
    hbm_bytes: int
    hbm_bw: float  # bytes/s
    peak_flops: float  # dense bf16 FLOP/s
    ici_bw: float  # bytes/s, bidirectional inter-chip interconnect per chip
    dims: int  # torus dimensions: gcloud suffix counts TensorCores (2 per chip) when 3
    device_kinds: tuple = ()  # names in jax's device_kind that mean this chip


def _peak_only(name: str, peak_flops: float, *device_kinds: str) -> Chip:
    """A chip known only by its peak FLOP/s (no compile target)."""
    return Chip(name, 0, 0.0, peak_flops, 0.0, 0, device_kinds or (name,))


CHIPS = {
    # https://cloud.google.com/tpu/docs/v4 : 275 TFLOP/s bf16, HBM2 32 GiB at 1200 GB/s. The
    # page gives no per-chip ICI figure; 268 GB/s = its "all-reduce bandwidth per Pod 1.1 PB/s"
    # over the Pod's 4096 chips.
    "v4": Chip("v4", 32 * GiB, 1200e9, 275e12, 1.1e15 / 4096, 3, ("TPU v4",)),
    # https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, HBM2 16 GB at 819 GB/s,
    # bidirectional ICI 400 GB/s per chip.
    "v5e": Chip("v5e", 16 * GiB, 819e9, 197e12, 400e9, 2, ("TPU v5 lite", "TPU v5e")),
    # https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, HBM2e 95 GiB at 2765 GB/s,
    # bidirectional ICI 1200 GB/s per chip (4800 Gbps).
    "v5p": Chip("v5p", 95 * GiB, 2765e9, 459e12, 1200e9, 3, ("TPU v5p", "TPU v5")),
    # https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, HBM 32 GB at 1638 GB/s,
    # bidirectional ICI 800 GB/s per chip.
    "v6e": Chip("v6e", 32 * GiB, 1638e9, 918e12, 800e9, 2, ("TPU v6 lite", "TPU v6e")),
}
# Peak FLOP/s only (dense bf16 / fp16 tensor cores), for the training logs' MFU. Sources: the
# Cloud TPU pages (cloud.google.com/tpu/docs/v2, /v3, /tpu7x) and NVIDIA's data sheets
# (nvidia.com/en-us/data-center/<product>: H100 / H200 / GH200 SXM, B200, A100, L40S, L4, A10,
# V100, T4; H800 / A800 as the H100 / A100 they derive from), dense: without 2:4 sparsity.
OTHER_CHIPS = [
    _peak_only("v2", 45e12, "TPU v2"), _peak_only("v3", 123e12, "TPU v3"),
    _peak_only("TPU7x", 2307e12),
    _peak_only("H100", 989e12), _peak_only("H200", 989e12), _peak_only("H800", 989e12),
    _peak_only("GH200", 989e12), _peak_only("B200", 2250e12), _peak_only("A100", 312e12),
    _peak_only("A800", 312e12), _peak_only("L40S", 362e12), _peak_only("L4", 121e12),
    _peak_only("A10", 125e12), _peak_only("V100", 125e12), _peak_only("T4", 65e12),
]
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


def chip_of(device_kind: str):
    """The Chip jax calls ``device_kind``, or None when the table lacks it (CPUs). The longest
    matching name wins ("TPU v5 lite" before "TPU v5", "A100" before "A10")."""
    by_kind = {kind: chip for chip in [*CHIPS.values(), *OTHER_CHIPS]
               for kind in chip.device_kinds}
    for kind in sorted(by_kind, key=len, reverse=True):
        if kind.lower() in device_kind.lower():
            return by_kind[kind]
    return None


def peak_flops(device_kind: str):
    """Peak FLOP/s of the chip jax calls ``device_kind`` (chip_of), or None when the table
    lacks it (CPUs: no honest single number)."""
    chip = chip_of(device_kind)
    return chip.peak_flops if chip is not None else None
