#!/usr/bin/env python3
"""Create, set up, train on, supervise and delete a Cloud TPU VM or pod slice with `gcloud`.

    python launch/tpu_vm.py create    my-tpu --zone=us-central2-b --accelerator-type=v4-8
    python launch/tpu_vm.py setup     my-tpu --zone=us-central2-b
    python launch/tpu_vm.py train     my-tpu --zone=us-central2-b \\
        --config=configs/t5_1_1_small.py --workdir=gs://my-bucket/runs/small
    python launch/tpu_vm.py stop-job  my-tpu --zone=us-central2-b   # the VM keeps billing
    python launch/tpu_vm.py delete    my-tpu --zone=us-central2-b   # billing stops

`supervise` does create + setup + train and repeats them after a preemption until the run
reaches its last step. `--dry-run` prints the gcloud commands instead of running them (one per
line, shell-quoted; the state checks between them are described on stderr). Standard library
only, so it runs on any laptop with gcloud.

On a pod slice (more than one host) every command that touches the VMs runs on all workers at
once (`--worker=all`): each host runs the same `t5lite train`, and jax.distributed.initialize()
finds the other hosts by itself (mesh.multihost=true). The job on each worker is run by
launch/tpu_job.sh (idempotent start, log copies to WORKDIR/worker_logs/).
"""

import os
import sys

# The launcher is the package launch/tpu/ beside this file; put launch/ first on the path so that
# this script runs from any directory, without installing anything.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tpu.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
