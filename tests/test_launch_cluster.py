"""The SLURM / multi-node scripts derive the jax.distributed environment; local_multiprocess
starts, prefixes and stops jobs."""

import os
import subprocess
import sys
import textwrap
import time

import pytest


from launch_helpers import LAUNCH, ROOT, local_multiprocess


# ----------------------------------------------------------------------------- SLURM, multinode


SBATCH = os.path.join(LAUNCH, "slurm_train.sbatch")
MULTINODE = os.path.join(LAUNCH, "multinode.sh")


def test_shell_scripts_parse():
    for script in (SBATCH, MULTINODE):
        r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def slurm_env(tmp_path, **env):
    """Run the sbatch's env part with fake SLURM_* variables (no scontrol / nvidia-smi)."""
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", SBATCH, "--print-env"], capture_output=True, text=True,
                       env={**base, **env})
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines())


@pytest.mark.parametrize("nodelist,first", [
    ("gpu[003-004,9],cpu1", "gpu003"), ("a1,b2", "a1"), ("node7", "node7"),
    ("node[12,15]", "node12"), ("rack-[1-2]", "rack-1")])
def test_slurm_env_derivation(tmp_path, nodelist, first):
    env = slurm_env(tmp_path, SLURM_JOB_NODELIST=nodelist, SLURM_JOB_ID="123456",
                    SLURM_NTASKS="16", SLURM_JOB_NUM_NODES="2", SLURM_PROCID="5")
    # 123456 % 4096 + 61440: the port jax.distributed picks itself under SLURM.
    assert env == {"T5LITE_COORDINATOR": f"{first}:62016", "T5LITE_NUM_PROCESSES": "16",
                   "T5LITE_PROCESS_ID": "5"}


def test_slurm_env_one_process_per_host_gets_all_gpus(tmp_path):
    env = slurm_env(tmp_path, SLURM_JOB_NODELIST="h[1-4]", SLURM_JOB_ID="7", SLURM_NTASKS="4",
                    SLURM_JOB_NUM_NODES="4", SLURM_GPUS_PER_NODE="a100:4", T5LITE_PORT="1234")
    assert env == {"T5LITE_COORDINATOR": "h1:1234", "T5LITE_NUM_PROCESSES": "4",
                   "JAX_LOCAL_DEVICE_IDS": "0,1,2,3"}


def test_slurm_outside_a_job_fails_clearly():
    r = subprocess.run(["bash", SBATCH, "--print-env"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "submit with sbatch" in r.stderr


def _fake_python(tmp_path):
    """Stands in for `python3 -m t5lite.cli`: prints its process id and arguments."""
    fake = tmp_path / "fake_python"
    fake.write_text('#!/bin/bash\necho "$T5LITE_PROCESS_ID|$*"\n')
    fake.chmod(0o755)
    return str(fake)


def test_slurm_srun_runs_every_task_with_its_process_id(tmp_path):
    """... and passes sbatch's --cpus-per-task on to srun (not inherited since Slurm 22.05)."""
    srun = tmp_path / "srun"  # like srun on the nodes: one task per SLURM_PROCID, in order
    srun.write_text(textwrap.dedent("""\
        #!/bin/bash
        [[ "$1" == --kill-on-bad-exit=1 ]] || { echo "missing --kill-on-bad-exit" >&2; exit 9; }
        shift
        [[ "$1" == --cpus-per-task=6 ]] || { echo "missing --cpus-per-task" >&2; exit 9; }
        shift
        for ((i = 0; i < SLURM_NTASKS; i++)); do SLURM_PROCID=$i "$@" || exit $?; done
        """))
    srun.chmod(0o755)
    r = subprocess.run(
        ["bash", SBATCH, "--config", "configs/tiny_t5.py", "--workdir", "/shared/run a"],
        capture_output=True, text=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[1-2]",
             "SLURM_JOB_ID": "10", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_CPUS_PER_TASK": "6", "T5LITE_PYTHON": _fake_python(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{i}|-m t5lite.cli train --config configs/tiny_t5.py --workdir /shared/run a "
        f"--set mesh.multihost=true --set mesh.coordinator_address=n1:61450 "
        f"--set mesh.num_processes=2 --set mesh.process_id={i}" for i in range(2)]


def test_multinode_passes_and_checks_the_env(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "T5LITE_PYTHON": _fake_python(tmp_path),
           "T5LITE_COORDINATOR": "10.0.0.1:12355", "T5LITE_NUM_PROCESSES": "2",
           "T5LITE_PROCESS_ID": "1"}
    r = subprocess.run(["bash", MULTINODE, "--config", "c.py", "--workdir", "/w"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "1|-m t5lite.cli train --config c.py --workdir /w --set mesh.multihost=true "
        "--set mesh.coordinator_address=10.0.0.1:12355 --set mesh.num_processes=2 "
        "--set mesh.process_id=1")
    for bad in ({"T5LITE_PROCESS_ID": "2"}, {"T5LITE_COORDINATOR": "10.0.0.1"},
                {"T5LITE_NUM_PROCESSES": ""}):
        r = subprocess.run(["bash", MULTINODE], capture_output=True, text=True,
                           env={**env, **bad})
        assert r.returncode != 0 and "T5LITE_" in r.stderr and r.stdout == ""


# ----------------------------------------------------------------------------- local processes


def test_local_child_env_and_command():
    env = local_multiprocess.child_env(
        {"XLA_FLAGS": "--xla_cpu_x=1 --xla_force_host_platform_device_count=8", "A": "b"},
        rank=1, num_processes=2, devices=4, coordinator="127.0.0.1:5")
    assert env["XLA_FLAGS"] == "--xla_cpu_x=1 --xla_force_host_platform_device_count=4"
    assert (env["T5LITE_PROCESS_ID"], env["T5LITE_NUM_PROCESSES"], env["A"]) == ("1", "2", "b")
    cmd = local_multiprocess.child_command(["t5lite", "train", "--config", "c"], 1, 2, "h:5")
    assert cmd == [sys.executable, "-m", "t5lite.cli", "train", "--config", "c",
                   "--set", "mesh.multihost=true", "--set", "mesh.coordinator_address=h:5",
                   "--set", "mesh.num_processes=2", "--set", "mesh.process_id=1"]
    assert local_multiprocess.child_command(["python", "x.py"], 0, 2, "h:5") == ["python", "x.py"]


def local(*argv, timeout=120):
    return subprocess.run([sys.executable, os.path.join(LAUNCH, "local_multiprocess.py"), *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_local_two_jax_processes_share_one_global_array():
    """Each process contributes its rows; a jitted sum over the global array sees all 8."""
    script = textwrap.dedent("""\
        import os
        import jax, jax.numpy as jnp, numpy as np
        jax.distributed.initialize(os.environ["T5LITE_COORDINATOR"],
                                   int(os.environ["T5LITE_NUM_PROCESSES"]),
                                   int(os.environ["T5LITE_PROCESS_ID"]))
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        rows = np.arange(4, dtype=np.float32) + 4 * jax.process_index()
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), rows, (8,))
        total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
        print("devices", jax.local_device_count(), jax.device_count(), "sum", float(total))
        """)
    r = local("-n", "2", "-d", "4", "--timeout", "100", "--", sys.executable, "-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "sum" in ln]
    assert sorted(lines) == ["[0] devices 4 8 sum 28.0", "[1] devices 4 8 sum 28.0"]


def test_local_failure_kills_the_others_and_returns_its_status():
    code = ("import os, sys, time\n"
            "if os.environ['T5LITE_PROCESS_ID'] == '1': print('bye'); sys.exit(3)\n"
            "print('waiting', flush=True); time.sleep(120)")
    start = time.monotonic()
    r = local("-n", "3", "-d", "1", "--", sys.executable, "-c", code)
    assert r.returncode == 3
    assert time.monotonic() - start < 60  # the sleepers were killed, not waited for
    assert "[1] bye" in r.stdout and "process 1 exited with 3" in r.stderr


def test_local_timeout_and_usage():
    r = local("-n", "2", "--timeout", "2", "--", sys.executable, "-c",
              "import time; time.sleep(60)")
    assert r.returncode == 124 and "timeout" in r.stderr
    r = local("-n", "2")
    assert r.returncode == 2 and "give the command after --" in r.stderr


def test_local_initialize_multihost_reads_the_launcher_env():
    """`t5lite`'s initialize_multihost takes the coordinator, count and index that the
    launchers export (T5LITE_*), so `--set mesh.multihost=true` alone is enough."""
    script = textwrap.dedent("""\
        import jax
        from t5lite import config
        from t5lite.mesh import partitioning
        partitioning.initialize_multihost(config.MeshConfig(multihost=True))
        mesh = partitioning.make_mesh(config.MeshConfig(data=2, fsdp=2))
        print("process", jax.process_index(), "of", jax.process_count(), "mesh", dict(mesh.shape))
        """)
    r = local("-n", "2", "-d", "2", "--timeout", "100", "--", sys.executable, "-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    mesh = "mesh {'data': 2, 'fsdp': 2, 'tensor': 1}"
    assert sorted(ln for ln in r.stdout.splitlines() if "process" in ln) == [
        f"[0] process 0 of 2 {mesh}", f"[1] process 1 of 2 {mesh}"]
