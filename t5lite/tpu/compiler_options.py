"""XLA options for programs compiled for TPU (train.partitioning.compiler_options asks here for
a TPU mesh).

Collective matmuls (XLA's windowed einsums: an fsdp all-gather or reduce-scatter matmul split
into a loop of one matmul per shard pair) are on only when mesh.collective_matmul asks for
them (config.MeshConfig): off, the step runs faster (bench/RESULTS.md).
"""

from __future__ import annotations

_ALL_GATHER_MATMULS = "xla_tpu_enable_windowed_einsum_for_all_gather"
_REDUCE_SCATTER_MATMULS = "xla_tpu_enable_windowed_einsum_for_reduce_scatter"


def libtpu_stack_overflow_risk(model_cfg) -> bool:
    """Whether libtpu 0.0.42.1 may overflow a compiler thread's stack (SIGSEGV after buffer
    assignment) compiling this model's step with the all-gather collective matmuls off: seen
    on scanned, rematerialised encoder-decoder steps with dropout, never on decoder-only
    ones, so only encoder-decoder steps with dropout under remat keep them."""
    return (model_cfg.dropout_rate > 0 and model_cfg.remat != "none"
            and model_cfg.architecture == "encoder_decoder")


def compiler_options(cfg) -> dict:
    """XLA options of a program jitted for TPU from ``cfg``."""
    if cfg.mesh.collective_matmul:
        return {}
    options = {_ALL_GATHER_MATMULS: False, _REDUCE_SCATTER_MATMULS: False}
    if libtpu_stack_overflow_risk(cfg.model):
        del options[_ALL_GATHER_MATMULS]  # XLA's default: on
    return options
