"""The TPU VM launcher in dry runs (the exact commands it would run, nothing run) and its
fit check (a config that does not fit is refused before anything is rented)."""

import os
import re
import shlex
import subprocess
import sys
import tempfile
import types

import pytest


from launch_helpers import (
    ALIVE, CAPACITY, JOB_ID, LAUNCH, QUOTA, ROOT, fit_check, gcloud, presets, retry, slices, tpu,
    worker_setup)


# ----------------------------------------------------------------------------- TPU VM: dry run

ZONE = ["--zone=us-central2-b", "--project=my-proj"]


@pytest.mark.parametrize("accelerator,runtime,hosts,create", [
    ("v4-8", "tpu-ubuntu2204-base", 1,
     "gcloud compute tpus tpu-vm create {n} --accelerator-type=v4-8 "
     "--version=tpu-ubuntu2204-base --zone=us-central2-b --project=my-proj"),
    ("v5p-32", "v2-alpha-tpuv5", 4,  # a pod slice: a queued resource unless --no-queued
     "gcloud compute tpus queued-resources create {n} --node-id={n} --accelerator-type=v5p-32 "
     "--runtime-version=v2-alpha-tpuv5 --zone=us-central2-b --project=my-proj"),
])
def test_tpu_dry_run_prints_exact_commands(accelerator, runtime, hosts, create):
    name = f"t5-{accelerator}"
    where = [*ZONE, f"--accelerator-type={accelerator}", "--dry-run"]
    archive = os.path.join(tempfile.gettempdir(), f"t5lite-src-{name}.tar.gz")
    fetch = ("rm -rf ~/t5lite && mkdir -p ~/t5lite && tar -xzf ~/t5lite-src.tar.gz -C ~/t5lite")
    expected = {
        "create": [create.format(n=name)],
        "setup": [f"git -C {ROOT} archive --format=tar.gz --output={archive} HEAD",
                  f"gcloud compute tpus tpu-vm scp {archive} {name}:t5lite-src.tar.gz "
                  "--worker=all --zone=us-central2-b --project=my-proj",
                  f"gcloud compute tpus tpu-vm ssh {name} --worker=all --zone=us-central2-b "
                  f"--project=my-proj {ALIVE} --command "
                  + shlex.quote(worker_setup.setup_script(fetch))],
        "delete": [f"gcloud compute tpus {'queued-resources' if hosts > 1 else 'tpu-vm'} delete "
                   f"{name} --zone=us-central2-b --project=my-proj "
                   + ("--force --quiet" if hosts > 1 else "--quiet")],
    }
    argv = {"create": ["create", name, *where], "setup": ["setup", name, *where],
            "delete": ["delete", name, *where] + ["--queued"] * (hosts > 1)}
    for sub, args in argv.items():
        r = tpu(*args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == expected[sub], sub
        assert f"{accelerator}: {hosts} host(s)" in r.stderr
    r = tpu("train", name, *where, "--config=configs/tiny_t5.py", "--workdir=gs://bkt/runs/a",
            "--set", "train.steps=100", "--env", "T5LITE_DATA_DIR=/mnt/data", "--skip-fit-check")
    assert r.returncode == 0, r.stderr
    probe = r"gs://bkt/runs/a/\.t5lite-probe-[0-9a-f]{8}"
    env_file = os.path.join(tempfile.gettempdir(), "t5lite-env-FILE")
    assert re.fullmatch(  # the bucket check, the --env file, the job: values never on a line
        f"gcloud storage cp - {probe} <<< 't5lite write probe'\n"
        f"gcloud storage cat {probe}\ngcloud storage rm {probe}\n"
        + re.escape(f"gcloud compute tpus tpu-vm scp {env_file} {name}:t5lite-env-")
        + JOB_ID + re.escape(" --worker=all --zone=us-central2-b --project=my-proj "
                             "--scp-flag=-oServerAliveInterval=30 "
                             "--scp-flag=-oServerAliveCountMax=4") + "\n"
        f"gcloud compute tpus tpu-vm ssh {name} --worker=all --zone=us-central2-b "
        f"--project=my-proj {ALIVE} --command " + re.escape(shlex.quote(
            "bash ~/t5lite/launch/tpu_job.sh run --job-id JOB --env-file t5lite-env-JOB "
            "--logs-url gs://bkt/runs/a/worker_logs --sync-every 60 -- "
            f"{presets(accelerator.split('-')[0])} ~/t5lite-venv/bin/python -m t5lite.cli train "
            "--config=configs/tiny_t5.py --workdir=gs://bkt/runs/a --set mesh.multihost=true "
            "--set train.steps=100")).replace("JOB", JOB_ID) + "\n", r.stdout)
    assert "/mnt/data" not in r.stdout + r.stderr and "T5LITE_DATA_DIR=***" in r.stderr


def test_tpu_setup_installs_python_3_12_with_uv():
    """The TPU images' python3 is 3.10; setup makes a uv venv with 3.12 and installs there."""
    script = worker_setup.setup_script("true", False)
    assert "python3 -m pip install --user --quiet --upgrade uv" in script
    assert "python3 -m uv venv --python 3.12 ~/t5lite-venv" in script
    assert "python3 -m uv pip install --python ~/t5lite-venv/bin/python -e '.[tpu]'" in script
    assert "python_requires=\">=3.11\"" in open(os.path.join(ROOT, "setup.py")).read()


def test_tpu_dry_run_runs_nothing(tmp_path):
    """--dry-run must not call gcloud or git: with an empty PATH it still succeeds."""
    r = subprocess.run([sys.executable, os.path.join(LAUNCH, "tpu_vm.py"), "setup", "x",
                        "--dry-run"], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["git", "gcloud", "gcloud"]


def test_tpu_create_options_queued_spot_best_effort():
    r = tpu("create", "q", "--zone=europe-west4-b", "--accelerator-type=v5litepod-16",
            "--spot", "--network=net", "--subnetwork=sub", "--service-account=sa@p.iam",
            "--scopes=cloud-platform", "--metadata=k=v", "--no-external-ip", "--internal-ip",
            "--dry-run")
    assert r.stdout.splitlines() == [
        "gcloud compute tpus queued-resources create q --node-id=q "
        "--accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite "
        "--zone=europe-west4-b --network=net --subnetwork=sub --service-account=sa@p.iam "
        "--scopes=cloud-platform --metadata=k=v --internal-ips --spot"]
    assert "v5litepod-16: 4 host(s)" in r.stderr and "queued resource" in r.stderr
    r = tpu("create", "q", "--accelerator-type=v6e-8", "--queued", "--best-effort",
            "--runtime-version=my-runtime", "--dry-run")
    assert r.stdout.splitlines() == [
        "gcloud alpha compute tpus queued-resources create q --node-id=q "
        "--accelerator-type=v6e-8 --runtime-version=my-runtime --best-effort"]
    assert "gcloud components install alpha" in r.stderr
    r = tpu("create", "q", "--accelerator-type=v4-32", "--no-queued", "--dry-run")
    assert r.stdout.startswith("gcloud compute tpus tpu-vm create q")
    r = tpu("create", "q", "--accelerator-type=v4-8", "--spot", "--dry-run")  # Spot: queued
    assert r.stdout.splitlines() == [
        "gcloud compute tpus queued-resources create q --node-id=q --accelerator-type=v4-8 "
        "--runtime-version=tpu-ubuntu2204-base --spot"]
    assert "Spot: creating a queued resource" in r.stderr
    r = tpu("create", "q", "--accelerator-type=v4-8", "--best-effort", "--dry-run")
    assert r.returncode == 2 and "add --queued" in r.stderr


def test_tpu_setup_from_git_logs_stop_job_and_iap():
    r = tpu("setup", "n", "--repo=https://example.com/t5lite.git", "--branch=v1",
            "--no-prepare-data", "--dry-run")
    fetch = ("rm -rf ~/t5lite && git clone --depth 1 --branch v1 "
             "https://example.com/t5lite.git ~/t5lite")
    assert r.stdout.splitlines() == [
        f"gcloud compute tpus tpu-vm ssh n --worker=all {ALIVE} --command "
        + shlex.quote(worker_setup.setup_script(fetch, False))]
    r = tpu("logs", "n", "--worker=3", "--lines=20", "--internal-ip", "--dry-run")
    assert r.stdout.splitlines() == [
        f"gcloud compute tpus tpu-vm ssh n --worker=3 --internal-ip {ALIVE} "
        "--command 'tail -n 20 -F ~/t5lite-train.log'"]
    r = tpu("stop-job", "n", "--tunnel-through-iap", "--ssh-alive-interval=0", "--dry-run")
    assert r.stdout.splitlines() == [
        "gcloud alpha compute tpus tpu-vm ssh n --worker=all --tunnel-through-iap "
        "--command 'bash ~/t5lite/launch/tpu_job.sh stop --grace 180'"]


def test_tpu_stop_is_ambiguous_and_names_the_billing_verbs():
    r = tpu("stop", "n", "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert "stop-job" in r.stderr and "still billed" in r.stderr and "delete" in r.stderr
    r = tpu("--help")
    assert "stop-job" in r.stdout and "KEEPS RUNNING" in r.stdout and "billing stops" in r.stdout


@pytest.mark.parametrize("accelerator,message", [
    ("v4-7", "must be a multiple of 8"),
    ("v5e-16", "use --accelerator-type=v5litepod-16"),
    ("v5litepod-12", "must be one of 1, 4, 8, 16"),
    ("v4p-8", "did you mean v4-8"),
    ("tpu", "is not GENERATION-SIZE"),
])
def test_tpu_bad_accelerator_type_is_a_clear_error(accelerator, message):
    r = tpu("create", "x", f"--accelerator-type={accelerator}", "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("tpu_vm.py: error:") and message in r.stderr


def test_tpu_train_needs_gcs_workdir():
    r = tpu("train", "x", "--config=c.py", "--workdir=/tmp/run", "--dry-run")
    assert r.returncode == 2 and "gs://BUCKET/PATH" in r.stderr


def test_tpu_hosts_per_slice():
    hosts = {a: slices.parse_accelerator_type(a).hosts for a in [
        "v2-8", "v3-32", "v4-8", "v4-16", "v4-32", "v4-128", "v5p-8", "v5p-32", "v5p-128",
        "v5litepod-1", "v5litepod-8", "v5litepod-16", "v5litepod-256", "v6e-8", "v6e-64"]}
    assert hosts == {"v2-8": 1, "v3-32": 4, "v4-8": 1, "v4-16": 2, "v4-32": 4, "v4-128": 16,
                     "v5p-8": 1, "v5p-32": 4, "v5p-128": 16, "v5litepod-1": 1,
                     "v5litepod-8": 1, "v5litepod-16": 4, "v5litepod-256": 64, "v6e-8": 1,
                     "v6e-64": 16}


# ----------------------------------------------------------------------------- TPU VM: fit check


def test_tpu_fit_fixes_follow_the_compile_report():
    report = {"chips": 8, "mesh": {"data": 8, "fsdp": 1, "tensor": 1}, "remat": "minimal",
              "grad_accum_steps": 2,
              "bytes_per_chip": {"params": 4 << 30, "opt_state": 8 << 30, "temp": 20 << 30}}
    fixes = fit_check.fit_fixes(report, [])
    assert fixes[0].startswith("--set mesh.fsdp=8 --set mesh.data=1")
    assert fixes[1].startswith("--set model.remat=full")
    assert fixes[2].startswith("--set train.grad_accum_steps=4")
    report = {"chips": 8, "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
              "bytes_per_chip": {"params": 40 << 30, "opt_state": 80 << 30, "temp": 1 << 30}}
    assert fit_check.fit_fixes(report, []) == ["a larger slice"]
    report["bytes_per_chip"]["temp"] = 40 << 30  # without "remat" in the report: from --set
    assert fit_check.fit_fixes(report, ["model.remat=full"]) == [
        "--set train.grad_accum_steps=2 (smaller micro-batches)"]


def test_tpu_fit_check_refuses_what_xla_refused_to_compile(monkeypatch):
    """`t5lite compile --json` reports XLA's out-of-memory refusal as compiled=false, fits=false
    with XLA's figure as the total; the fit check refuses with it and names the fixes."""
    report = {"compiled": False, "fits": False, "chips": 1, "remat": "minimal",
              "mesh": {"data": 1, "fsdp": 1, "tensor": 1}, "grad_accum_steps": 1,
              "hbm_bytes_per_chip": 16 << 30, "est_step_seconds": None,
              "bytes_per_chip": {"params": 1 << 30, "opt_state": 2 << 30, "temp": 37 << 30,
                                 "total": 40 << 30}}
    monkeypatch.setattr(fit_check, "compile_report", lambda *args: report)
    args = types.SimpleNamespace(skip_fit_check=False, config="configs/t5_1_1_tiny.py",
                                 set=["data.batch_size=32768"])
    with pytest.raises(fit_check.LaunchError) as e:
        fit_check.fit_check(args, "v5litepod-1")
    message = str(e.value)
    assert message.startswith("configs/t5_1_1_tiny.py does not fit v5litepod-1: 40.0 of 16.0 "
                              "GiB HBM per chip (XLA refused to compile the step)")
    assert "--set model.remat=full" in message and "--set train.grad_accum_steps=2" in message
    assert "--set mesh.fsdp" not in message and "--skip-fit-check" in message


HAVE_COMPILE = os.path.isdir(os.path.join(ROOT, "t5lite", "tpu"))


@pytest.mark.skipif(not HAVE_COMPILE, reason="needs `t5lite compile` (t5lite/tpu/)")
def test_tpu_train_refuses_a_config_that_does_not_fit():
    """The real `t5lite compile` for one v5e chip (16 GiB): tiny T5 at batch 32768 needs ~40 GiB
    of activations; the launcher refuses before any gcloud command and names the fixes."""
    r = subprocess.run([sys.executable, os.path.join(LAUNCH, "tpu_vm.py"), "train", "x",
                        "--accelerator-type=v5litepod-1", "--config=configs/t5_1_1_tiny.py",
                        "--workdir=gs://b/r", "--set", "data.batch_size=32768", "--dry-run"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""  # no gcloud command
    err = r.stderr.strip().splitlines()[-1]
    assert "does not fit v5litepod-1" in err and "HBM per chip" in err
    assert "--set model.remat=full" in err and "--set train.grad_accum_steps=2" in err
    assert "--skip-fit-check" in err


# ------------------------------------------------------------------------- TPU VM: retries, output


def test_tpu_retry_kinds_and_jittered_backoff():
    assert retry.failure_kind(CAPACITY) == "capacity"
    assert retry.failure_kind(QUOTA) == "permanent"  # RESOURCE_EXHAUSTED, but a quota
    assert retry.failure_kind("ERROR: (gcloud.compute.tpus.tpu-vm.create) PERMISSION_DENIED: "
                              "Permission 'tpu.nodes.create' denied") == "permanent"
    assert retry.failure_kind("ERROR: (gcloud.compute.tpus.tpu-vm.ssh) unrecognized "
                              "arguments: --bad") == "permanent"
    assert retry.failure_kind("ssh: connect to host 10.0.0.1 port 22: Connection timed out"
                              ) == "transient"
    assert retry.tries_for("permanent", 10) == 3 and retry.tries_for("capacity", 10) == 10
    backoff = retry.Backoff(60, 1800, rng=__import__("random").Random(0))
    delays = [backoff.delay(a) for a in range(1, 9)]
    for attempt, d in enumerate(delays, 1):
        full = min(1800, 60 * 2 ** (attempt - 1))
        assert full / 2 <= d <= full  # bounded, and jittered within the doubling step
    assert len({round(d / min(1800, 60 * 2 ** a), 3) for a, d in enumerate(delays)}) > 1


def test_tpu_stream_keeps_bounded_output(capsys):
    """A job's output is echoed, not kept: only the report lines and a short tail stay."""
    args = types.SimpleNamespace(name="x", dry_run=False)
    cloud = gcloud.Cloud(args)
    code = ("for i in range(200000): print('step', i)\n"
            "print('t5lite-job: worker 0 exit 0')\nprint('last line')")
    rc, marks = cloud.stream([sys.executable, "-c", code])
    assert rc == 0 and marks == ["t5lite-job: worker 0 exit 0"]
    assert cloud.last_error.splitlines()[-1] == "last line"
    assert len(cloud.last_error.splitlines()) == gcloud.TAIL_LINES
    assert "step 199999" in capsys.readouterr().out
