"""XLA options that make a TPU program's collectives asynchronous and overlap them with compute,
per chip generation: the one table that `t5lite compile` and `t5lite train` on a TPU (through
mesh.partitioning.compiler_options, per program) and the TPU launcher's workers (their
LIBTPU_INIT_ARGS, for every program of the process) all read.

Standard library only, no t5lite import: launch/tpu loads this file by its path (the launcher
runs where t5lite may not be installed).

With libtpu's defaults every fsdp all-gather of a step is scheduled blocking (bench/RESULTS.md,
"TPU: asynchronous collectives per chip generation"). MaxText passes these flags through
LIBTPU_INIT_ARGS in its run scripts; the values here are theirs, per generation, as of
AI-Hypercomputer/maxtext e591f30cbbf217ed67ef71263ec0538239f9c3b8. Flags MaxText tunes per
model (scoped VMEM limits, reduce-scatter layouts) are left out. libtpu aborts on a flag it
does not know in LIBTPU_INIT_ARGS (and refuses one as a compile option):
tests/test_xla_flags.py compiles with each generation's set on the pinned libtpu.
"""

from __future__ import annotations

# Continuation fusion: an async collective fused with the compute fusions scheduled between its
# start and done (benchmarks/xla_flags_library.py:37-45, CF_FOR_ALL_GATHER).
_CONTINUATION_FUSION = {
    "xla_enable_async_all_gather": True,
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
}
# The gradient all-reduces of the data axis combined and overlapped (every v5e / v6e / v5p
# script below passes these two together).
_DATA_PARALLEL_ALL_REDUCE = {
    "xla_tpu_enable_data_parallel_all_reduce_opt": True,
    "xla_tpu_data_parallel_opt_different_sized_ops": True,
}

ASYNC_COLLECTIVES = {
    # src/maxtext/configs/tpu/v4/22b.sh:56 (and 52b.sh:56): async all-gather only
    "v4": {"xla_enable_async_all_gather": True},
    # src/maxtext/configs/tpu/v5e/16b.sh:42 (the same line in 32b, 64b, 128b, llama2_7b ...)
    "v5e": {**_DATA_PARALLEL_ALL_REDUCE, **_CONTINUATION_FUSION},
    # src/maxtext/configs/tpu/v5p/64b.sh:42 (the same line in 128b, 256b, 512b, 1024b): the
    # v5e set plus megacore's (v5p runs one program over two TensorCores) and asynchronous
    # collective permutes with the all-gathers pipelined into the backward pass
    "v5p": {**_DATA_PARALLEL_ALL_REDUCE, **_CONTINUATION_FUSION,
            "xla_tpu_megacore_fusion_allow_ags": False,
            "xla_enable_async_collective_permute": True,
            "xla_tpu_enable_ag_backward_pipelining": True},
    # src/maxtext/configs/tpu/v6e/gpt3_175b.sh:39, without its VMEM limit and layout flags
    "v6e": {**_DATA_PARALLEL_ALL_REDUCE, **_CONTINUATION_FUSION},
}
# gcloud's names of a generation (launch/tpu/slices.py) beside the chip table's
_ALIASES = {"v5litepod": "v5e"}


def async_collective_options(generation: str) -> dict:
    """The options of ``generation`` (the chip table's name, or gcloud's: v5litepod); {} for a
    generation without any (v2, v3, GPUs)."""
    return dict(ASYNC_COLLECTIVES.get(_ALIASES.get(generation, generation), {}))


def libtpu_init_args(generation: str) -> str:
    """The same options as LIBTPU_INIT_ARGS text (--name=true ...); "" when there are none."""
    return " ".join(f"--{k}={str(v).lower()}"
                    for k, v in async_collective_options(generation).items())
