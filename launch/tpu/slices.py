"""TPU slice types: how `--accelerator-type` names a slice and how many hosts (TPU VMs) it has."""

from __future__ import annotations

import dataclasses
import difflib
import re

from .messages import LaunchError

@dataclasses.dataclass(frozen=True)
class Generation:
    """How one TPU generation names its slices and maps them onto hosts (TPU VMs)."""

    unit: str  # what the number in "v4-32" counts: "cores" (TensorCores) or "chips"
    per_host: int  # cores or chips per host in a multi-host slice
    single_host_max: int  # largest size that fits on one host
    sizes: tuple  # allowed sizes; () = any multiple of per_host up to max_size
    max_size: int
    runtime: str  # default --runtime-version (Cloud TPU docs: "TPU software versions")


GENERATIONS = {
    "v2": Generation("cores", 8, 8, (8, 32, 128, 256, 512), 512, "tpu-ubuntu2204-base"),
    "v3": Generation("cores", 8, 8, (8, 32, 64, 128, 256, 512, 1024, 2048), 2048,
                     "tpu-ubuntu2204-base"),
    "v4": Generation("cores", 8, 8, (), 8192, "tpu-ubuntu2204-base"),
    "v5p": Generation("cores", 8, 8, (), 12288, "v2-alpha-tpuv5"),
    # v5e / v6e: 1, 4 or 8 chips on one VM; bigger slices are 4-chip VMs.
    "v5litepod": Generation("chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256), 256,
                            "v2-alpha-tpuv5-lite"),
    "v6e": Generation("chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256), 256, "v2-alpha-tpuv6e"),
}
ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6": "v6e"}


@dataclasses.dataclass(frozen=True)
class SliceType:
    accelerator_type: str
    generation: str
    size: int
    hosts: int
    runtime: str


def parse_accelerator_type(accelerator_type: str) -> SliceType:
    """'v5p-32' -> SliceType(hosts=4, ...); unknown or impossible shapes raise LaunchError."""
    m = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator_type.strip().lower())
    known = ", ".join(f"{g}-N" for g in GENERATIONS)
    if not m:
        raise LaunchError(f"accelerator type {accelerator_type!r} is not GENERATION-SIZE; "
                          f"use one of {known} (e.g. v4-8, v5p-32, v5litepod-16).")
    gen_name, size = m.group(1), int(m.group(2))
    if gen_name in ALIASES:
        raise LaunchError(f"gcloud calls {gen_name} slices '{ALIASES[gen_name]}-N': "
                          f"use --accelerator-type={ALIASES[gen_name]}-{size}.")
    if gen_name not in GENERATIONS:
        hint = difflib.get_close_matches(gen_name, list(GENERATIONS), n=1)
        raise LaunchError(f"unknown TPU generation {gen_name!r} in {accelerator_type!r}"
                          + (f"; did you mean {hint[0]}-{size}?" if hint else ".")
                          + f" Known: {known}.")
    gen = GENERATIONS[gen_name]
    valid = (size in gen.sizes) if gen.sizes else (
        0 < size <= gen.max_size and size % gen.per_host == 0)
    if not valid:
        allowed = ("one of " + ", ".join(str(s) for s in gen.sizes) if gen.sizes else
                   f"a multiple of {gen.per_host} up to {gen.max_size}")
        raise LaunchError(f"{accelerator_type}: the size of a {gen_name} slice counts "
                          f"{gen.unit} and must be {allowed}.")
    hosts = 1 if size <= gen.single_host_max else size // gen.per_host
    return SliceType(f"{gen_name}-{size}", gen_name, size, hosts, gen.runtime)
