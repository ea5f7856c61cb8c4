"""Tolerances for float32 results of two different programs that compute the same thing
(another gradient rule, remat policy, scan unrolling, micro-batching, another library).

Such programs sum in different, equally valid orders. Each rounding is relative to the
partial sums, which are of the order of the tensor's large entries, so an element that is
small because large terms cancel carries the large terms' rounding: a gradient entry of 2e-4
in a tensor whose entries reach 1e-1 can differ by 1e-6 between two correct programs (seen on
a loaded 2-core machine). A tolerance must therefore scale with the tensor, not with the
element and not a fixed absolute number.

REL = 1e-5 of the tensor's largest magnitude is ~84 float32 ulps (eps = 1.19e-7): room for the
~sqrt(n) growth of rounding over the reductions of the tiny test models (widths <= 64, a few
layers, forward and backward), and still tight enough that a dropped or mis-scaled term, which
moves entries by a visible fraction of the tensor's scale, fails.
"""

from __future__ import annotations

import jax
import numpy as np

REL = 1e-5


def assert_close_at_scale(actual, desired, rel: float = REL, rtol: float = 1e-4,
                          err_msg: str = "") -> None:
    """|actual - desired| <= rtol * |desired| + rel * max|desired|, elementwise."""
    desired = np.asarray(desired)
    scale = float(np.max(np.abs(desired))) if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rel * scale, err_msg=err_msg)


def assert_trees_close_at_scale(actual, desired, rel: float = REL, rtol: float = 1e-4,
                                err_msg: str = "") -> None:
    """assert_close_at_scale on every leaf, at the whole tree's scale: a leaf whose true value
    is zero (a query kernel's gradient when every position is alike) holds only the rounding
    of the other leaves' terms, so its own largest entry is noise, not a scale."""
    leaves = [np.asarray(x) for x in jax.tree.leaves(desired)]
    scale = max((float(np.max(np.abs(x))) for x in leaves if x.size), default=0.0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=rel * scale,
                                                         err_msg=err_msg), actual, desired)
