#!/bin/bash
# t5lite on plain machines (no SLURM, no TPU VM): run this once on every node (or once per GPU).
#
#   # node 0 (its address is the coordinator):
#   T5LITE_COORDINATOR=10.0.0.1:12355 T5LITE_NUM_PROCESSES=2 T5LITE_PROCESS_ID=0 \
#       bash launch/multinode.sh --config configs/t5_1_1_base.py --workdir /shared/runs/base
#   # node 1: the same, with T5LITE_PROCESS_ID=1
#
# Every process runs the same `t5lite train ... --set mesh.multihost=true` with the address,
# count and index passed as --set mesh.* flags, so jax.distributed.initialize() connects them.
# Optional: T5LITE_PYTHON (default python3), JAX_LOCAL_DEVICE_IDS=0,1 to give a process only
# some of the node's GPUs. The workdir must be shared by all nodes (NFS, gs://).
set -euo pipefail

: "${T5LITE_COORDINATOR:?set T5LITE_COORDINATOR=HOST:PORT (the address of process 0, same everywhere)}"
: "${T5LITE_NUM_PROCESSES:?set T5LITE_NUM_PROCESSES to the total number of processes}"
: "${T5LITE_PROCESS_ID:?set T5LITE_PROCESS_ID to this process index, 0 .. N-1}"

if [[ ! "$T5LITE_COORDINATOR" =~ ^[^:]+:[0-9]+$ ]]; then
    echo "multinode.sh: T5LITE_COORDINATOR=$T5LITE_COORDINATOR must look like HOST:PORT" >&2
    exit 2
fi
if [[ ! "$T5LITE_NUM_PROCESSES" =~ ^[1-9][0-9]*$ || ! "$T5LITE_PROCESS_ID" =~ ^[0-9]+$ ]] ||
        ((T5LITE_PROCESS_ID >= T5LITE_NUM_PROCESSES)); then
    echo "multinode.sh: need 0 <= T5LITE_PROCESS_ID < T5LITE_NUM_PROCESSES" \
         "(got $T5LITE_PROCESS_ID and $T5LITE_NUM_PROCESSES)" >&2
    exit 2
fi

exec "${T5LITE_PYTHON:-python3}" -m t5lite.cli train "$@" \
    --set mesh.multihost=true \
    --set "mesh.coordinator_address=$T5LITE_COORDINATOR" \
    --set "mesh.num_processes=$T5LITE_NUM_PROCESSES" \
    --set "mesh.process_id=$T5LITE_PROCESS_ID"
