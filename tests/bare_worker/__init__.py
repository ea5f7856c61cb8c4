"""A fresh TPU VM image for the worker-side launcher tests (tests/test_launch_worker.py).

image.py makes the sandbox (what a TPU image's ssh session has, and lacks); wheelhouse.py the
offline package index that stands in for PyPI. Everything else runs for real in it: setup's
script from launch/tpu/worker_setup.py with bash (pip installs uv for the user, `uv venv`,
`uv pip install -e '.[tpu]'` resolving t5lite's real requirements), the data unpacking of
launch/tpu/data_ship.py, and launch/tpu_job.sh running the first `t5lite train` in that venv.

Stood in, and why: the package index (4 GB of wheels from PyPI is neither offline nor fast:
each wheel carries the real metadata, its files are links to this venv's); the CPython that
`uv venv --python X` downloads (the interpreter under the test, which those files are built
for: X is its version, 3.11 here, where a TPU worker gets 3.12).
"""
