"""Finding a registered task or mixture by name. Its own module so that the input pipeline and
the offline cache, which both look tasks up, import it from below."""

from __future__ import annotations

import difflib

import seqio

from t5lite.errors import UserError


def get_mixture_or_task(name: str):
    """seqio's lookup, with a UserError that lists close names."""
    import t5lite.tasks  # noqa: F401  (registers everything)
    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
        hint = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        raise UserError(f"no task or mixture named {name!r}." + (
            f" Did you mean: {', '.join(hint)}?" if hint else "")
            + " See `t5lite tasks list`.") from None
