"""The XLA flags the suite's processes compile with, set before jax is imported (conftest, and
tests/test_model_digests.py when it records): 8 simulated CPU devices, and XLA:CPU's LLVM at
-O0. The tests' programs are tiny and each runs a few times, so compiling them is most of the
suite's cost; -O0 cut the suite's test time by a tenth on one 2-core box and a fifth on another
(bench/RESULTS.md, "Test suite wall time"). libtpu's programs do not read it (a v5p
compile's report is identical with it), and CLI runs that a test starts with XLA_FLAGS of
their own (the long training runs) keep -O2. A flag the user's XLA_FLAGS already sets is kept
as given."""

import os

FLAGS = {"xla_force_host_platform_device_count": "8", "xla_backend_optimization_level": "0"}


def apply() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    for name, value in FLAGS.items():
        if name not in flags:
            flags += f" --{name}={value}"
    os.environ["XLA_FLAGS"] = flags.strip()
