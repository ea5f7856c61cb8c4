"""Which cloud failures are worth another try, and the bounded, jittered exponential backoff
`supervise` waits between tries (create, setup, copies, ssh) and between job restarts."""

from __future__ import annotations

import dataclasses
import random
import re

# Retrying these cannot help: the same flags, quota and permissions fail the same way. They
# still get a few tries (PERMANENT_TRIES): gcloud words some passing errors alike.
PERMANENT = re.compile(
    r"PERMISSION_DENIED|INVALID_ARGUMENT|UNAUTHENTICATED|unrecognized arguments|"
    r"invalid choice|At most one of|must be specified|quota|billing|\b403\b|"
    r"does not have .*permission|not authorized|Reauthentication|login", re.I)
# The zone has no free TPUs of the type now; capacity comes back (Spot especially).
CAPACITY = re.compile(
    r"no more capacity|insufficient capacity|stockout|RESOURCE_EXHAUSTED|"
    r"not enough resources|resources are not available|ZONE_RESOURCE_POOL_EXHAUSTED", re.I)
PERMANENT_TRIES = 3


def failure_kind(message: str) -> str:
    """'permanent', 'capacity' or 'transient' (connections, 5xx, anything unrecognised)."""
    if CAPACITY.search(message) and not re.search(r"quota", message, re.I):
        return "capacity"
    if PERMANENT.search(message):
        return "permanent"
    return "transient"


@dataclasses.dataclass
class Backoff:
    """Delays doubling from `base` up to `cap`, each drawn from [d/2, d] ("equal jitter"), so
    that several launchers that failed together do not retry in lockstep."""

    base: float
    cap: float
    rng: random.Random = dataclasses.field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the `attempt`-th failure (1-based)."""
        d = min(self.cap, self.base * 2 ** max(attempt - 1, 0))
        return d / 2 + self.rng.uniform(0, d / 2)


def tries_for(kind: str, retries: int) -> int:
    return min(PERMANENT_TRIES, retries) if kind == "permanent" else retries
