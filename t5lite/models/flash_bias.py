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

import concurrent.futures
import functools

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models.positions import RelativePositionBias, alibi_bias

BIAS_KINDS = ("none", "relative", "alibi")


def _now(fn):
    """fn() evaluated now, in a thread of its own: outside any trace under way here, and
    outside its mesh (eager ops under a mesh of abstract TPU devices would have to run on
    devices that do not exist on a CPU host compiling for them). Small host-side arrays."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: np.asarray(fn())).result()


@functools.lru_cache(maxsize=None)
def bucket_runs(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple:
    """((first rel of the run, bucket), ...) in increasing rel; the first run reaches down to
    -inf and the last one up to +inf."""
    reach = 2 * max_distance + 2  # the buckets are constant beyond +-max_distance
    module = RelativePositionBias(num_buckets, max_distance, 1, bidirectional)
    buckets = _now(lambda: module.bucket(jnp.arange(-reach, reach + 1, dtype=jnp.int32)))
    runs = [(-reach, int(buckets[0]))]
    for rel, b in zip(range(-reach + 1, reach + 1), buckets[1:]):
        if int(b) != runs[-1][1]:
            runs.append((rel, int(b)))
    assert len({b for _, b in runs}) == len(runs), "a bucket covers two runs of distances"
    return tuple(runs)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The model's ALiBi slopes (positions.alibi_bias at distance one), shape [H]."""
    one = np.ones((1, 1), np.int32)
    return -_now(lambda: alibi_bias(one * 0, one, num_heads))[0, :, 0, 0]


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


def runs_array(runs: tuple) -> np.ndarray:
    """The runs as the kernel reads them from SMEM: int32 [first rels..., buckets...]."""
    return np.asarray([r for r, _ in runs] + [b for _, b in runs], np.int32)


def _run_index(runs_ref, num_runs: int, rel):
    """Index of the run holding distance ``rel`` (a scalar loop over the run starts)."""
    return jax.lax.fori_loop(1, num_runs, lambda n, c: c + (runs_ref[n] <= rel).astype(
        jnp.int32), jnp.int32(0))


def bias_tile(table_ref, runs_ref, head, q0, k0, shape, kind: str, num_runs: int,
              num_buckets: int):
    """The float32 [bq, bk] position bias of one tile (None for kind "none"). ``table_ref``:
    the flattened [H * N] table (relative) or [H] slopes (alibi), ``runs_ref`` runs_array,
    both in SMEM. Only the runs that start inside the tile's distances cost a select: a tile
    beyond +-max_distance is one fill."""
    if kind == "none":
        return None
    rel = relative_distance(q0, k0, shape)
    if kind == "alibi":
        return -table_ref[head] * jnp.abs(rel).astype(jnp.float32)
    base = head * num_buckets
    lo, hi = tile_range(q0, k0, shape)
    first, last = _run_index(runs_ref, num_runs, lo), _run_index(runs_ref, num_runs, hi)

    def step(n, out):
        return jnp.where(rel >= runs_ref[n], table_ref[base + runs_ref[num_runs + n]], out)

    start = jnp.full(shape, table_ref[base + runs_ref[num_runs + first]], jnp.float32)
    return jax.lax.fori_loop(first + 1, last + 1, step, start)


def accumulate_table_grad(dtab_ref, runs_ref, ds, q0, k0, num_runs: int):
    """dtab_ref[bucket] (rows of a [N_pad, 128] lane-replicated block) += the sum of the
    logits gradient ``ds`` [bq, bk] over the tile's entries in that bucket: from the sums
    over rel >= each run start inside the tile, differenced."""
    lo, hi = tile_range(q0, k0, ds.shape)
    first, last = _run_index(runs_ref, num_runs, lo), _run_index(runs_ref, num_runs, hi)
    rel = relative_distance(q0, k0, ds.shape)
    rows = jax.lax.broadcasted_iota(jnp.int32, dtab_ref.shape, 0)

    def total(x):
        return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)

    def add(acc, run, value_11):
        return acc + jnp.where(rows == runs_ref[num_runs + run], value_11, 0.0)

    def step(n, carry):  # carry: (sum over rel >= start of run n - 1, accumulator)
        above, acc = carry
        here = total(jnp.where(rel >= runs_ref[n], ds, 0.0))
        return here, add(acc, n - 1, above - here)

    above, acc = jax.lax.fori_loop(first + 1, last + 1, step,
                                   (total(ds), jnp.zeros(dtab_ref.shape, jnp.float32)))
    dtab_ref[...] += add(acc, last, above)
