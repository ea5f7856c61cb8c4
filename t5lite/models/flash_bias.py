"""Position biases computed inside the flash attention kernel, tile by tile, and the gradient of
T5's bias table, accumulated per bucket.

T5's bucket of a relative distance ``rel = key slot - query slot`` is a step function of rel:
each bucket covers one contiguous run of distances, and beyond +-max_distance it is constant.
The runs are found once at trace time by evaluating the model's own bucket function
(positions.RelativePositionBias.bucket) on every distance that can change it, so the kernel's
buckets are the model's by construction (no second log formula to keep in step). A tile's bias
is then a chain of selects over the run starts, reading the [heads, buckets] table from SMEM;
a tile whose distances all lie beyond the last run start (or before the first) is one value,
the common case far from the diagonal. ALiBi is ``-slope_h * |rel|``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from t5lite.models.positions import RelativePositionBias, alibi_bias

BIAS_KINDS = ("none", "relative", "alibi")


@functools.lru_cache(maxsize=None)
def bucket_runs(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple:
    """((first rel of the run, bucket), ...) in increasing rel; the first run reaches down to
    -inf and the last one up to +inf."""
    reach = 2 * max_distance + 2  # the buckets are constant beyond +-max_distance
    module = RelativePositionBias(num_buckets, max_distance, 1, bidirectional)
    with jax.ensure_compile_time_eval():
        buckets = np.asarray(module.bucket(jnp.arange(-reach, reach + 1, dtype=jnp.int32)))
    runs = [(-reach, int(buckets[0]))]
    for rel, b in zip(range(-reach + 1, reach + 1), buckets[1:]):
        if int(b) != runs[-1][1]:
            runs.append((rel, int(b)))
    assert len({b for _, b in runs}) == len(runs), "a bucket covers two runs of distances"
    return tuple(runs)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The model's ALiBi slopes (positions.alibi_bias at distance one), shape [H]."""
    with jax.ensure_compile_time_eval():
        one = jnp.ones((1, 1), jnp.int32)
        return -np.asarray(alibi_bias(one * 0, one, num_heads))[0, :, 0, 0]


def relative_distance(q0, k0, shape):
    """rel = key slot - query slot over a [bq, bk] tile whose first query / key slots are
    q0 / k0."""
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return (k0 + cols) - (q0 + rows)


def tile_range(q0, k0, shape):
    """(smallest, largest) rel in the tile (scalars)."""
    bq, bk = shape
    return k0 - (q0 + bq - 1), k0 + bk - 1 - q0


def bias_tile(table_ref, head, q0, k0, shape, kind: str, runs: tuple, num_buckets: int):
    """The float32 [bq, bk] position bias of one tile (None for kind "none"). ``table_ref``:
    the flattened [H * N] table (relative) or [H] slopes (alibi) in SMEM."""
    if kind == "none":
        return None
    if kind == "alibi":
        rel = relative_distance(q0, k0, shape)
        return -table_ref[head] * jnp.abs(rel).astype(jnp.float32)
    base = head * num_buckets
    first, last = table_ref[base + runs[0][1]], table_ref[base + runs[-1][1]]
    lo, hi = tile_range(q0, k0, shape)

    def steps():
        rel = relative_distance(q0, k0, shape)
        out = jnp.full(shape, first, jnp.float32)
        for start, bucket in runs[1:]:
            out = jnp.where(rel >= start, table_ref[base + bucket], out)
        return out

    def constant(value):
        return lambda: jnp.full(shape, value, jnp.float32)

    return jax.lax.cond(hi < runs[1][0], constant(first),
                        lambda: jax.lax.cond(lo >= runs[-1][0], constant(last), steps))


def accumulate_table_grad(dtab_ref, ds, q0, k0, runs: tuple):
    """dtab_ref[bucket] (rows of a [N_pad, 128] lane-replicated block) += the sum of the
    logits gradient ``ds`` [bq, bk] over the tile's entries in that bucket."""
    lo, hi = tile_range(q0, k0, ds.shape)

    def add(bucket, value_11):
        row = pl.ds(bucket, 1)
        dtab_ref[row, :] += jnp.broadcast_to(value_11, (1, dtab_ref.shape[1]))

    def total(x):
        return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)

    @pl.when(hi < runs[1][0])
    def _():
        add(runs[0][1], total(ds))

    @pl.when(lo >= runs[-1][0])
    def _():
        add(runs[-1][1], total(ds))

    @pl.when((hi >= runs[1][0]) & (lo < runs[-1][0]))
    def _():
        rel = relative_distance(q0, k0, ds.shape)
        above = total(ds)  # sum over rel >= start of the current run
        for n, (_, bucket) in enumerate(runs):
            nxt = (total(jnp.where(rel >= runs[n + 1][0], ds, 0.0)) if n + 1 < len(runs)
                   else jnp.zeros_like(above))
            add(bucket, above - nxt)
            above = nxt
