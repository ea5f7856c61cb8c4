"""Where the code lives on this machine and on every TPU worker."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REMOTE_DIR = "~/t5lite"  # where the code lives on every worker
# The TPU images' system Python is 3.10; the pinned jax / flax / orbax need >= 3.11. setup makes
# a venv with uv (pip-installed for the user: no root, no apt lock on a booting VM, the same
# interpreter on every image; uv downloads a standalone CPython build), as MaxText does.
VENV = "~/t5lite-venv"
VENV_PYTHON = VENV + "/bin/python"
PYTHON_VERSION = "3.12"
SETUP_MARK = VENV + "/.t5lite-setup"  # written when setup finished on a worker
# Prepared data on every worker: t5lite's default data dir there, so `train` finds it unset.
# It is built on the launching machine and copied (launch/tpu/data_ship.py): building it needs
# pip inside the venv, npm and apt package lists, which a TPU image lacks.
REMOTE_DATA_DIR = "~/.cache/t5lite"
DATA_ARCHIVE = "t5lite-data.tar.gz"  # in each worker's home while it is unpacked
LOG_LINK = "~/t5lite-train.log"  # tpu_job.sh: the current job's log on each worker
JOB = f"bash {REMOTE_DIR}/launch/tpu_job.sh"
WORKER_LOGS = "worker_logs"  # WORKDIR/worker_logs/<job id>/worker-<N>.log
