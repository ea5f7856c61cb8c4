"""Launchers: the TPU VM launcher against a fake gcloud (tests/fake_gcloud.py: exact calls,
queued states, ssh drops, preemptions) and in dry runs; the SLURM / multi-node scripts derive
the jax.distributed environment; local_multiprocess starts, prefixes and stops jobs."""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import pytest

from t5lite.mesh import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")


def _load(name):
    spec = importlib.util.spec_from_file_location("launch_" + name, os.path.join(LAUNCH, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["launch_" + name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _load_tpu_module(name):
    """launch/tpu/NAME.py, imported as launch_tpu.NAME (launch/ is not on sys.path)."""
    if "launch_tpu" not in sys.modules:
        package = os.path.join(LAUNCH, "tpu")
        spec = importlib.util.spec_from_file_location(
            "launch_tpu", os.path.join(package, "__init__.py"),
            submodule_search_locations=[package])
        sys.modules["launch_tpu"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["launch_tpu"])
    return importlib.import_module("launch_tpu." + name)


slices = _load_tpu_module("slices")
fit_check = _load_tpu_module("fit_check")
worker_setup = _load_tpu_module("worker_setup")
retry = _load_tpu_module("retry")
gcloud = _load_tpu_module("gcloud")
local_multiprocess = _load("local_multiprocess")


def tpu(*argv):
    return subprocess.run([sys.executable, os.path.join(LAUNCH, "tpu_vm.py"), *argv],
                          capture_output=True, text=True, timeout=60)


# ----------------------------------------------------------------------------- TPU VM: dry run

ZONE = ["--zone=us-central2-b", "--project=my-proj"]
JOB_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"
ALIVE = "--ssh-flag=-oServerAliveInterval=30 --ssh-flag=-oServerAliveCountMax=4"
KEEPALIVE = ALIVE.split()
PRESETS = ("env TPU_MIN_LOG_LEVEL=0 TPU_STDERR_LOG_LEVEL=1 "
           "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS=60 TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES=256")


def presets(generation: str) -> str:
    """PRESETS and the generation's LIBTPU_INIT_ARGS (t5lite/mesh/xla_flags.py), shell-quoted."""
    return f"{PRESETS} " + shlex.quote(f"LIBTPU_INIT_ARGS={xla_flags.libtpu_init_args(generation)}")


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
    fetch = "rm -rf ~/t5lite && git clone --depth 1 --branch v1 https://example.com/t5lite.git ~/t5lite"
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


# ----------------------------------------------------------------------------- TPU VM: fake cloud


def _script(path, source):
    path.write_text(f"#!{sys.executable}\n" + source if not source.startswith("#!") else source)
    path.chmod(0o755)


class FakeCloud:
    """tests/fake_gcloud.py on PATH as `gcloud` (records calls, plays states), fake ssh-agent
    tools, and fake workers (their homes under nodes/) that run the real launch/tpu_job.sh."""

    def __init__(self, tmp_path, plan=("ok",), qr_plan=None, agent=True, **scripted):
        self.dir = tmp_path / "cloud"
        for d in ("bin", "workerbin", "gcs/bkt", "gcs/b", "nodes"):  # buckets bkt and b exist
            (self.dir / d).mkdir(parents=True)
        here = os.path.dirname(os.path.abspath(__file__))
        _script(self.dir / "bin" / "gcloud", open(os.path.join(here, "fake_gcloud.py")).read())
        _script(self.dir / "workerbin" / "python3",
                open(os.path.join(here, "fake_worker_python.py")).read())
        _script(self.dir / "bin" / "ssh-keygen", "#!/bin/bash\n"  # a key with a passphrase
                '[[ "$1" == -l ]] && { echo "256 SHA256:fakefp me (ED25519)"; exit 0; }\nexit 1\n')
        _script(self.dir / "bin" / "ssh-add", "#!/bin/bash\n"
                '[[ "$FAKE_AGENT_HAS_KEY" == 1 ]] && { echo "256 SHA256:fakefp me (ED25519)"; '
                'exit 0; }\necho "The agent has no identities."; exit 1\n')
        (self.dir / "cloud.json").write_text(json.dumps({
            "queued": {}, "nodes": {}, "qr_plan": qr_plan,
            "fail_reason": "There is no more capacity in the zone \"us-central2-b\"",
            "workers": {"v4-8": 1, "v4-16": 2}, **scripted}))
        (self.dir / "plan.json").write_text(json.dumps(list(plan)))
        self.home = tmp_path / "home"
        (self.home / ".ssh").mkdir(parents=True)
        for f in ("google_compute_engine", "google_compute_engine.pub"):
            (self.home / ".ssh" / f).write_text("key\n")
        self.agent = agent

    def env(self, home=None):
        return {**os.environ, "PATH": f"{self.dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
                "HOME": str(home or self.home), "FAKE_CLOUD": str(self.dir),
                "SSH_AUTH_SOCK": "/tmp/fake-agent.sock",
                "FAKE_AGENT_HAS_KEY": str(int(self.agent))}

    def run(self, *argv, timeout=120, home=None):
        return subprocess.run([sys.executable, os.path.join(LAUNCH, "tpu_vm.py"), *argv],
                              capture_output=True, text=True, timeout=timeout,
                              env=self.env(home))

    def start(self, *argv):
        """The launcher in the background (a supervise that another command then stops)."""
        return subprocess.Popen([sys.executable, os.path.join(LAUNCH, "tpu_vm.py"), *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env())

    def wait_for_starts(self, n, proc, timeout=60):
        """Until n trainer starts are recorded (the job runs) or the launcher ended."""
        deadline = time.monotonic() + timeout
        while len(self.jsonl("starts.jsonl")) < n and proc.poll() is None:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)

    def calls(self, clear=True):
        path = self.dir / "calls.jsonl"
        out = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
        if clear and path.exists():
            path.unlink()
        return out

    def state(self, key):
        return json.loads((self.dir / "cloud.json").read_text())[key]

    def set_state(self, **kw):
        state = json.loads((self.dir / "cloud.json").read_text())
        state.update(kw)
        (self.dir / "cloud.json").write_text(json.dumps(state))

    def jsonl(self, name):
        path = self.dir / name
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []

    def worker(self, node, w):
        return self.dir / "nodes" / node / f"w{w}"


TPUS = ["compute", "tpus"]
Z = ["--zone=us-central2-b", "--project=proj"]


def describe(kind, name):
    return [*TPUS, kind, "describe", name, *Z, "--format=json"]


def ssh_call(name, command, worker="all"):
    return [*TPUS, "tpu-vm", "ssh", name, f"--worker={worker}", *Z, *KEEPALIVE, "--command",
            command]


BUCKET_CHECK = [["storage", "cp", "-"], ["storage", "cat"], ["storage", "rm"]]  # a probe


def without_polls(calls):
    """The calls less the state checks made while a job runs (their number depends on time)."""
    return [c for c in calls if "describe" not in c[2:4]]


def test_tpu_end_to_end_on_a_queued_pod_slice(tmp_path):
    """create (queued, waits through CREATING / WAITING for ACTIVE) -> setup -> train -> logs ->
    stop-job -> delete, on a 2-worker slice, with every gcloud call asserted."""
    cloud = FakeCloud(tmp_path, plan=["ok"], qr_plan=[
        "CREATING", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "ACTIVE"])
    r = cloud.run("create", "pod", *Z, "--accelerator-type=v4-16", "--poll-seconds=0")
    assert r.returncode == 0, r.stderr
    qr = describe("queued-resources", "pod")
    assert cloud.calls() == [qr, [
        *TPUS, "queued-resources", "create", "pod", "--node-id=pod", "--accelerator-type=v4-16",
        "--runtime-version=tpu-ubuntu2204-base", *Z]] + [qr] * 4
    progress = [ln.split(": ")[2].split(" ")[0] for ln in r.stderr.splitlines()
                if "queued resource pod:" in ln]
    assert progress == ["CREATING", "WAITING_FOR_RESOURCES", "ACTIVE"]
    assert "Next: python launch/tpu_vm.py setup pod" in r.stderr

    r = cloud.run("setup", "pod", *Z)
    assert r.returncode == 0, r.stdout + r.stderr
    fetch = "rm -rf ~/t5lite && mkdir -p ~/t5lite && tar -xzf ~/t5lite-src.tar.gz -C ~/t5lite"
    calls = cloud.calls()
    archive = calls[1][4]  # a file of its own (this run's), removed after the copy
    assert re.fullmatch(re.escape(os.path.join(tempfile.gettempdir(), "t5lite-src-pod-"))
                        + r"\w+\.tar\.gz", archive) and not os.path.exists(archive)
    assert calls == [
        describe("tpu-vm", "pod"),
        [*TPUS, "tpu-vm", "scp", archive, "pod:t5lite-src.tar.gz", "--worker=all", *Z],
        ssh_call("pod", worker_setup.setup_script(fetch))]
    installs = cloud.jsonl("installs.jsonl")
    for w in ("0", "1"):  # each worker: uv, a 3.12 venv, t5lite[tpu] into it; no data prepare
        assert [i["argv"][:4] for i in installs if i["worker"] == w] == [
            ["-m", "pip", "install", "--user"], ["-m", "uv", "venv", "--python"],
            ["-m", "uv", "pip", "install"]]
        assert (cloud.worker("pod", w) / "t5lite" / "launch" / "tpu_job.sh").exists()

    r = cloud.run("train", "pod", *Z, "--config=configs/tiny_t5.py", "--workdir=gs://bkt/runs/a",
                  "--set", "train.steps=3", "--skip-fit-check", "--sync-logs-every=1")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = cloud.calls()
    assert calls[0] == describe("tpu-vm", "pod")
    checks, calls = calls[1:4], without_polls(calls[4:])
    assert [c[:len(b)] for c, b in zip(checks, BUCKET_CHECK)] == BUCKET_CHECK
    assert checks[0][3] == checks[1][2] == checks[2][2]  # written, read, deleted
    assert re.fullmatch(r"gs://bkt/runs/a/\.t5lite-probe-[0-9a-f]{8}", checks[0][3])
    assert not list((cloud.dir / "gcs" / "bkt" / "runs" / "a").glob(".t5lite-probe-*"))
    assert len(calls) == 1 and calls[0][:-1] == ssh_call("pod", "")[:-1]
    calls = [None, *calls]
    assert re.fullmatch(re.escape(
        "bash ~/t5lite/launch/tpu_job.sh run --job-id JOB --logs-url gs://bkt/runs/a/worker_logs "
        f"--sync-every 1 -- {presets('v4')} ~/t5lite-venv/bin/python -m t5lite.cli train "
        "--config=configs/tiny_t5.py --workdir=gs://bkt/runs/a --set mesh.multihost=true "
        "--set train.steps=3").replace("JOB", JOB_ID), calls[1][-1])
    assert "t5lite-job: worker 0 exit 0" in r.stdout and "t5lite-job: worker 1 exit 0" in r.stdout
    assert "training finished on all 2 worker(s)" in r.stderr and "billing" in r.stderr
    job_id = re.search(JOB_ID, calls[1][-1]).group(0)
    copies = {c[3] for c in cloud.jsonl("worker_calls.jsonl") if c[:2] == ["storage", "cp"]}
    assert copies == {f"gs://bkt/runs/a/worker_logs/{job_id}/worker-{w}.log" for w in (0, 1)}
    for w in (0, 1):  # the logs outlive the VM: copied next to the checkpoints
        copy = cloud.dir / "gcs" / "bkt" / "runs" / "a" / "worker_logs" / job_id / f"worker-{w}.log"
        assert "done: reached the last step" in copy.read_text()
        assert "=== exit 0" in copy.read_text()

    r = cloud.run("logs", "pod", *Z, "--worker=1", "--no-follow", "--lines=2")
    assert r.returncode == 0 and "=== exit 0" in r.stdout
    assert cloud.calls() == [describe("tpu-vm", "pod"),
                             ssh_call("pod", "tail -n 2 ~/t5lite-train.log", worker="1")]

    r = cloud.run("stop-job", "pod", *Z)
    assert r.returncode == 0 and "worker 1 no job running" in r.stdout
    assert "still running and billing" in r.stderr
    assert cloud.calls() == [describe("tpu-vm", "pod"),
                             ssh_call("pod", "bash ~/t5lite/launch/tpu_job.sh stop --grace 180")]

    r = cloud.run("stop-vm", "pod", *Z)
    assert r.returncode == 2 and "can only be deleted" in r.stderr
    cloud.calls()
    r = cloud.run("delete", "pod", *Z)  # finds out by itself that pod is a queued resource
    assert r.returncode == 0, r.stderr
    assert cloud.calls() == [
        describe("queued-resources", "pod"), describe("tpu-vm", "pod"),
        ssh_call("pod", "test -f ~/t5lite/launch/tpu_job.sh && bash ~/t5lite/launch/tpu_job.sh "
                        "stop --grace 180 || true"),
        [*TPUS, "queued-resources", "delete", "pod", *Z, "--force", "--quiet"]]
    assert cloud.state("queued") == {} and cloud.state("nodes") == {}
    assert "billing for it stopped" in r.stderr

    r = cloud.run("logs", "pod", *Z, "--worker=0", "--workdir=gs://bkt/runs/a")
    assert r.returncode == 0 and "done: reached the last step" in r.stdout  # from the copy


@pytest.mark.parametrize("qr_plan,extra,message", [
    (["CREATING", "FAILED"], [], "is FAILED: There is no more capacity in the zone"),
    (["WAITING_FOR_RESOURCES"] * 50, ["--wait-timeout=0.3", "--poll-seconds=0.05"],
     "still WAITING_FOR_RESOURCES after"),
])
def test_tpu_queued_create_reports_failure_and_timeout(tmp_path, qr_plan, extra, message):
    cloud = FakeCloud(tmp_path, qr_plan=qr_plan)
    r = cloud.run("create", "q", *Z, "--accelerator-type=v4-16", "--poll-seconds=0", *extra)
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("tpu_vm.py: error:") and message in err


def test_tpu_status_and_delete_find_a_plain_vm(tmp_path):
    cloud = FakeCloud(tmp_path)
    assert cloud.run("create", "vm", *Z, "--accelerator-type=v4-8").returncode == 0
    assert cloud.calls() == [describe("tpu-vm", "vm"), [
        *TPUS, "tpu-vm", "create", "vm", "--accelerator-type=v4-8",
        "--version=tpu-ubuntu2204-base", *Z]]
    r = cloud.run("status", "vm", *Z)
    assert r.returncode == 0 and "state: READY" in r.stdout
    assert cloud.calls() == [describe("queued-resources", "vm"), describe("tpu-vm", "vm"),
                             [*TPUS, "tpu-vm", "describe", "vm", *Z]]
    r = cloud.run("stop-vm", "vm", *Z)  # billing stops, the VM stays
    assert r.returncode == 0 and "no longer billed" in r.stderr
    assert cloud.calls()[-1] == [*TPUS, "tpu-vm", "stop", "vm", *Z]
    r = cloud.run("train", "vm", *Z, "--config=c.py", "--workdir=gs://b/r", "--skip-fit-check")
    assert r.returncode == 2 and "is STOPPED, not READY: start it" in r.stderr
    assert cloud.run("start-vm", "vm", *Z).returncode == 0
    assert cloud.state("nodes")["vm"]["state"] == "READY"
    nodes = cloud.state("nodes")
    nodes["vm"]["state"] = "PREEMPTED"
    cloud.set_state(nodes=nodes)
    r = cloud.run("train", "vm", *Z, "--config=c.py", "--workdir=gs://b/r", "--skip-fit-check")
    assert r.returncode == 2 and "is PREEMPTED, not READY" in r.stderr and "supervise" in r.stderr
    r = cloud.run("logs", "vm", *Z)
    assert r.returncode == 2 and "--workdir=gs://" in r.stderr
    cloud.calls()
    r = cloud.run("delete", "vm", *Z, "--no-stop-job")
    assert r.returncode == 0
    assert cloud.calls()[-1] == [*TPUS, "tpu-vm", "delete", "vm", *Z, "--quiet"]
    r = cloud.run("delete", "vm", *Z)
    assert r.returncode == 2 and "no TPU VM or queued resource named vm" in r.stderr


def test_tpu_pod_needs_the_key_in_ssh_agent(tmp_path):
    cloud = FakeCloud(tmp_path, agent=False)
    assert cloud.run("create", "pod", *Z, "--accelerator-type=v4-16", "--no-queued").returncode == 0
    cloud.calls()
    r = cloud.run("setup", "pod", *Z)
    assert r.returncode == 2
    assert 'eval "$(ssh-agent -s)" && ssh-add' in r.stderr and "2 workers" in r.stderr
    assert cloud.calls() == [describe("tpu-vm", "pod")]  # no ssh attempted


def test_tpu_train_is_idempotent(tmp_path):
    """A second `train` attaches to the running job, another command is refused, the live log
    and pid file stay; a stale libtpu lockfile is removed before a start; stop-job saves."""
    cloud = FakeCloud(tmp_path, plan=["slow"])
    assert cloud.run("create", "vm", *Z, "--accelerator-type=v4-8").returncode == 0
    assert cloud.run("setup", "vm", *Z, "--no-prepare-data").returncode == 0
    home = cloud.worker("vm", 0)
    (home / "libtpu_lockfile").write_text("")
    args = ["train", "vm", *Z, "--config=configs/tiny_t5.py", "--workdir=gs://b/r",
            "--skip-fit-check", "--detach"]
    r = cloud.run(*args)
    assert r.returncode == 0 and "started job" in r.stdout, r.stdout + r.stderr
    assert "removing stale" in r.stdout and not (home / "libtpu_lockfile").exists()
    pid = (home / "t5lite-job" / "pid").read_text()
    r = cloud.run("setup", "vm", *Z, "--no-prepare-data")  # never under a running job
    assert r.returncode == 1 and "a job is running on this worker" in r.stdout
    r = cloud.run(*args)
    assert r.returncode == 0 and "attached to the running job" in r.stdout
    r = cloud.run(*args[:-1], "--set", "train.steps=5")
    assert r.returncode == 3 and "refused: another job is running" in r.stdout
    assert "stop-job" in r.stderr
    assert (home / "t5lite-job" / "pid").read_text() == pid
    assert len(cloud.jsonl("starts.jsonl")) == 1
    log = (home / "t5lite-train.log").read_text()
    assert log.count("=== t5lite job") == 1 and "step 1 " in log
    r = cloud.run("stop-job", "vm", *Z, "--grace=20")
    assert "worker 0 stopped (exit 75)" in r.stdout, r.stdout + r.stderr
    log = (home / "t5lite-train.log").read_text()
    assert log.startswith("=== t5lite job") and "checkpoint saved" in log
    # a job whose pid file was lost is stale: ended before the next start, not run beside it
    assert cloud.run(*args).returncode == 0
    old = int((home / "t5lite-job" / "pid").read_text())
    (home / "t5lite-job" / "pid").unlink()
    r = cloud.run(*args)
    assert f"ending stale process {old}:" in r.stdout and "started job" in r.stdout, r.stdout
    assert not _running(old)
    assert "worker 0 stopped (exit 75)" in cloud.run("stop-job", "vm", *Z).stdout


def _running(pid):
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def test_tpu_train_survives_an_ssh_drop(tmp_path):
    """gcloud re-runs the command after the connection drops: the job is not started twice."""
    cloud = FakeCloud(tmp_path, plan=["long"])
    assert cloud.run("create", "vm", *Z, "--accelerator-type=v4-8").returncode == 0
    assert cloud.run("setup", "vm", *Z, "--no-prepare-data").returncode == 0
    (cloud.dir / "drop-ssh").touch()  # the next job ssh drops once
    r = cloud.run("train", "vm", *Z, "--config=c.py", "--workdir=gs://b/r", "--skip-fit-check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "closed by remote host" in r.stdout, r.stdout + r.stderr
    # the re-sent command finds the job running (the usual case) or, on a loaded machine,
    # already ended; either way it is not started twice
    assert ("attached to the running job" in r.stdout
            or re.search(r"job \S+ has already ended", r.stdout)), r.stdout + r.stderr
    assert len(cloud.jsonl("starts.jsonl")) == 1
    log = (cloud.worker("vm", 0) / "t5lite-train.log").read_text()
    assert log.count("=== t5lite job") == 1 and "=== exit 0" in log


def test_tpu_job_resent_after_the_job_ended_reports_it_instead_of_running_it_again(tmp_path):
    """gcloud re-sends `run` with the same job id when the connection drops as the job ends:
    the worker reports that job's exit code (and last lines) and does not run it a second time;
    a new id (a new `train`) runs again."""
    env = {**os.environ, "HOME": str(tmp_path), "T5LITE_WORKER": "0",
           "T5LITE_TPU_LOCKFILE": str(tmp_path / "lk")}
    ran = tmp_path / "ran"

    def run(job_id):
        return subprocess.run(
            ["bash", os.path.join(LAUNCH, "tpu_job.sh"), "run", "--job-id", job_id, "--",
             "bash", "-c", f"echo once >>{ran}; echo trained; exit 3"],
            capture_output=True, text=True, timeout=60, env=env)

    first = run("J1")
    assert first.returncode == 3 and "started job J1" in first.stdout, first.stdout + first.stderr
    again = run("J1")
    assert again.returncode == 3, again.stdout + again.stderr
    assert "job J1 has already ended" in again.stdout and "trained" in again.stdout
    assert again.stdout.strip().splitlines()[-1] == "t5lite-job: worker 0 exit 3"
    assert ran.read_text() == "once\n"
    log = (tmp_path / "t5lite-job" / "logs" / "J1.log").read_text()
    assert log.count("=== t5lite job") == 1
    assert run("J2").returncode == 3 and ran.read_text() == "once\nonce\n"


def test_tpu_supervise_restarts_after_preemption_and_a_lost_slice(tmp_path):
    """exit 75 -> the same command again; the slice preempted under the job -> the queued
    resource is deleted, created again, set up again; exit 0 -> done."""
    cloud = FakeCloud(tmp_path, plan=["preempt", "lost", "ok"],
                      qr_plan=["WAITING_FOR_RESOURCES", "ACTIVE"])
    r = cloud.run("supervise", "pod", *Z, "--accelerator-type=v4-16", "--spot",
                  "--config=configs/tiny_t5.py", "--workdir=gs://b/r", "--skip-fit-check",
                  "--no-prepare-data", "--backoff=0", "--poll-seconds=0", "--wait-timeout=60",
                  timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    actions = [c[2:4] if c[0] == "compute" else c[:2] for c in cloud.calls()
               if "describe" not in c]
    run = ["tpu-vm", "ssh"]
    assert actions == [["storage", "cp"], ["storage", "cat"], ["storage", "rm"],  # bucket check
                       ["queued-resources", "create"], ["tpu-vm", "scp"], run, run,  # setup, train
                       run, run,  # setup check, train (slice lost)
                       ["queued-resources", "delete"], ["queued-resources", "create"],
                       ["tpu-vm", "scp"], run, run], (actions, r.stdout, r.stderr)
    notes = [ln for ln in r.stderr.splitlines() if "supervise:" in ln]
    assert "preempted (exit 75, checkpoint saved); restart 1/20" in notes[0]
    assert "the queued resource is SUSPENDED" in notes[1] and "restart 2/20" in notes[1]
    assert "deleting it to create it again" in notes[2]
    assert "reached its last step" in notes[3] and len(notes) == 4
    starts = cloud.jsonl("starts.jsonl")
    assert sorted(s["worker"] for s in starts) == ["0", "0", "0", "1", "1", "1"]
    assert len({tuple(s["argv"]) for s in starts}) == 1  # the same command every time


@pytest.mark.parametrize("plan,extra,rc,message,runs", [
    (["fail"], [], 1, "worker 0 exited 1: a real failure, not restarting", 1),
    (["preempt"], ["--max-restarts=1"], 75, "giving up after 1 restarts", 2),
])
def test_tpu_supervise_stops_on_failure_and_gives_up(tmp_path, plan, extra, rc, message, runs):
    cloud = FakeCloud(tmp_path, plan=plan)
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", "--config=c.py",
                  "--workdir=gs://b/r", "--skip-fit-check", "--no-prepare-data", "--backoff=0",
                  *extra)
    assert r.returncode == rc, r.stdout + r.stderr
    assert message in r.stderr
    assert len(cloud.jsonl("starts.jsonl")) == runs


SUPERVISE = ["--config=c.py", "--workdir=gs://b/r", "--skip-fit-check", "--no-prepare-data",
             "--backoff=0", "--poll-seconds=0.2"]
CAPACITY = ('ERROR: (gcloud.compute.tpus.tpu-vm.create) {"code": 8, "message": "There is no '
            'more capacity in the zone \\"us-central2-b\\"; you can try in another zone"}')
QUOTA = ("ERROR: (gcloud.compute.tpus.tpu-vm.create) RESOURCE_EXHAUSTED: Quota limit "
         "'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.")


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


def test_tpu_routes_are_checked_before_anything_runs(tmp_path):
    """gcloud refuses --internal-ip with --tunnel-through-iap (one routing group); the
    launcher says so before any call. --no-external-ip is the create flag (--internal-ips)."""
    cloud = FakeCloud(tmp_path)
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", "--internal-ip",
                  "--tunnel-through-iap", *SUPERVISE)
    assert r.returncode == 2 and "exclude each other" in r.stderr, r.stderr
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", "--no-external-ip",
                  *SUPERVISE)
    assert r.returncode == 2 and "--no-external-ip" in r.stderr and "--internal-ip" in r.stderr
    assert cloud.calls() == []  # nothing asked of gcloud, nothing rented
    # the fake is as strict as gcloud: the same combination, and a create-only flag on ssh
    for flags, message in [(["--internal-ip", "--tunnel-through-iap"], "At most one of"),
                           (["--internal-ips"], "unrecognized arguments: --internal-ips")]:
        r = subprocess.run(["gcloud", "alpha", "compute", "tpus", "tpu-vm", "ssh", "vm",
                            "--worker=all", *flags, "--command", "true"],
                           capture_output=True, text=True, env=cloud.env())
        assert r.returncode == 2 and message in r.stderr
    r = cloud.run("create", "vm", *Z, "--accelerator-type=v4-8", "--no-external-ip",
                  "--internal-ip")
    assert r.returncode == 0, r.stderr
    assert cloud.calls()[-1][-1] == "--internal-ips"


def test_tpu_supervise_retries_capacity_and_connection_errors(tmp_path):
    """A plain create that meets a stockout twice, a copy and an ssh that time out: each is
    retried after a logged, jittered wait, and the run still finishes."""
    cloud = FakeCloud(tmp_path, create_errors=[CAPACITY, CAPACITY],
                      conn_failures={"scp": 1, "ssh": 2})
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", "--no-queued", *SUPERVISE)
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "supervise:" in ln]
    assert [n.split("failed (")[1].split(":")[0] for n in notes if "failed (" in n] == [
        "capacity", "capacity", "transient", "transient"], notes
    assert "try 2/10 in 0s" in notes[0] and "try 3/10" in notes[1]
    assert "no more capacity" in notes[0] and "reached its last step" in notes[-1]
    creates = [c for c in cloud.calls() if c[2:4] == ["tpu-vm", "create"]]
    assert len(creates) == 3 and len(cloud.jsonl("starts.jsonl")) == 1


def test_tpu_supervise_stops_on_a_permanent_error(tmp_path):
    cloud = FakeCloud(tmp_path, create_errors=[QUOTA] * 5)
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", *SUPERVISE)
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()[-1]
    assert "failed 3 time(s), giving up (permanent)" in err and "Quota limit" in err
    assert len([c for c in cloud.calls() if c[2:4] == ["tpu-vm", "create"]]) == 3


def test_tpu_silently_dead_slice_ends_the_wait(tmp_path):
    """The slice is preempted under the job and the ssh connection just hangs (no keepalive
    here): the state poll notices, ends the connection, and supervise recreates the slice."""
    cloud = FakeCloud(tmp_path, plan=["hang", "ok"])
    start = time.monotonic()
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", "--ssh-alive-interval=0",
                  *SUPERVISE, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - start < 60  # the hung connection is not waited out
    notes = [ln for ln in r.stderr.splitlines() if "supervise:" in ln]
    assert "the TPU VM is PREEMPTED; restart 1/20" in notes[0], notes
    assert "deleting it to create it again" in notes[1] and "last step" in notes[-1]
    assert [s["run"] for s in cloud.jsonl("starts.jsonl")] == ["1", "2"]


def test_tpu_keepalive_ends_a_dead_connection(tmp_path):
    """Without a state poll in time, ssh's own keepalive (ServerAlive*, passed with
    --ssh-flag) ends a connection to a host that stopped answering."""
    cloud = FakeCloud(tmp_path, plan=["hang"])
    assert cloud.run("create", "vm", *Z, "--accelerator-type=v4-8").returncode == 0
    assert cloud.run("setup", "vm", *Z, "--no-prepare-data").returncode == 0
    r = cloud.run("train", "vm", *Z, "--config=c.py", "--workdir=gs://b/r", "--skip-fit-check",
                  "--poll-seconds=600", "--ssh-alive-interval=1", "--ssh-alive-count=2")
    assert r.returncode == 255 and "not responding" in r.stdout, r.stdout + r.stderr
    job = [c for c in cloud.calls() if "ssh" in c and "tpu_job.sh run" in c[-1]]
    assert job[0][-4:-2] == ["--ssh-flag=-oServerAliveInterval=1",
                             "--ssh-flag=-oServerAliveCountMax=2"]


def test_tpu_stop_job_under_supervise_is_a_stop(tmp_path):
    """stop-job while supervise runs: the job exits 75, which is a stop here, not a
    preemption: supervise ends without a restart."""
    cloud = FakeCloud(tmp_path, plan=["slow"])
    proc = cloud.start("supervise", "vm", *Z, "--accelerator-type=v4-8", *SUPERVISE)
    cloud.wait_for_starts(1, proc)
    r = cloud.run("stop-job", "vm", *Z, "--grace=20")
    assert r.returncode == 0 and "worker 0 stopped (exit 75)" in r.stdout, r.stdout + r.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "t5lite-job: worker 0 exit 75 stopped" in out
    assert "supervise: stopped (" in err and "restart 1/" not in err
    assert len(cloud.jsonl("starts.jsonl")) == 1 and "vm" in cloud.state("nodes")
    # a new supervise clears the old stop and runs
    (cloud.dir / "plan.json").write_text(json.dumps(["ok"]))
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", *SUPERVISE)
    assert r.returncode == 0 and "earlier stop (stop-job at" in r.stderr, r.stderr


def test_tpu_stop_while_supervise_waits_for_capacity(tmp_path):
    cloud = FakeCloud(tmp_path, qr_plan=["WAITING_FOR_RESOURCES"] * 10_000)
    proc = cloud.start("supervise", "pod", *Z, "--accelerator-type=v4-16", *SUPERVISE)
    deadline = time.monotonic() + 60
    while not any("create" in c for c in cloud.calls(clear=False)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    r = cloud.run("stop-job", "pod", *Z)  # no VM yet to stop a job on, but supervise stops
    assert r.returncode == 2 and "no TPU VM named pod" in r.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "supervise: stopped (stop-job at" in err, out + err
    assert cloud.state("queued")["pod"]["state"] == "WAITING_FOR_RESOURCES"


@pytest.mark.parametrize("elsewhere", [False, True])
def test_tpu_delete_under_supervise_is_not_undone(tmp_path, elsewhere):
    """delete while supervise runs: here (the stop marker) or from another machine (no
    marker; the slice is gone rather than preempted): the slice is not created again."""
    cloud = FakeCloud(tmp_path, plan=["slow"])
    proc = cloud.start("supervise", "vm", *Z, "--accelerator-type=v4-8", *SUPERVISE)
    cloud.wait_for_starts(1, proc)
    other = tmp_path / "other-home"
    (other / ".ssh").mkdir(parents=True)
    r = cloud.run("delete", "vm", *Z, "--grace=20", *["--no-stop-job"] * elsewhere,
                  home=other if elsewhere else None)
    assert r.returncode == 0, r.stdout + r.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "supervise: stopped (" in err and "not restarting" in err
    assert ("deleted, not preempted" in err) == elsewhere
    assert cloud.state("nodes") == {}
    assert len([c for c in cloud.calls() if c[2:4] == ["tpu-vm", "create"]]) == 1


def test_tpu_env_values_never_printed_or_stored(tmp_path):
    """--env values reach the trainer through a file only the user can read; they are on no
    command line, in no output, log or log copy. --env also overrides a preset."""
    secret = "s3cr3t-Value-42"
    cloud = FakeCloud(tmp_path, plan=["ok"])
    assert cloud.run("create", "vm", *Z, "--accelerator-type=v4-8").returncode == 0
    assert cloud.run("setup", "vm", *Z, "--no-prepare-data").returncode == 0
    r = cloud.run("train", "vm", *Z, "--config=c.py", "--workdir=gs://b/r", "--skip-fit-check",
                  "--env", f"MY_TOKEN={secret}", "--env", "TPU_STDERR_LOG_LEVEL=0")
    assert r.returncode == 0, r.stdout + r.stderr
    (start,) = cloud.jsonl("starts.jsonl")
    assert start["env"] == {"MY_TOKEN": secret, "TPU_STDERR_LOG_LEVEL": "0",
                            "TPU_MIN_LOG_LEVEL": "0",
                            "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
                            "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "256",
                            "LIBTPU_INIT_ARGS": xla_flags.libtpu_init_args("v4")}
    assert "MY_TOKEN=***" in r.stderr
    home = cloud.worker("vm", 0)
    job_home = home / "t5lite-job"
    (env_file,) = job_home.glob("env.*")
    assert env_file.stat().st_mode & 0o777 == 0o600 and not list(home.glob("t5lite-env-*"))
    seen = [r.stdout, r.stderr, (cloud.dir / "calls.jsonl").read_text(),
            (cloud.dir / "worker_calls.jsonl").read_text(), (job_home / "cmd").read_text()]
    seen += [p.read_text() for p in (cloud.dir / "gcs").rglob("*.log")]
    seen += [p.read_text() for p in (job_home / "logs").glob("*.log")]
    assert len(seen) == 7 and "env file: MY_TOKEN TPU_STDERR_LOG_LEVEL" in seen[-1]
    assert not [text for text in seen if secret in text]


@pytest.mark.parametrize("scripted,extra,message", [
    ({}, ["--workdir=gs://nobucket/r"], "bucket gs://nobucket does not exist"),
    ({"writers": {"b": []}}, [], "you cannot write to gs://b"),
    ({"writers": {"b": ["user"]}, "create_errors": [QUOTA] * 3}, ["--service-account=sa@p.iam"],
     "cannot act as sa@p.iam"),  # the user may write, the VMs' account is not checkable
    ({"writers": {"b": ["user"]}, "impersonable": ["sa@p.iam"]},
     ["--service-account=sa@p.iam"], "sa@p.iam cannot write to gs://b"),
])
def test_tpu_bucket_is_checked_before_renting(tmp_path, scripted, extra, message):
    cloud = FakeCloud(tmp_path, **scripted)
    r = cloud.run("supervise", "vm", *Z, "--accelerator-type=v4-8", *SUPERVISE, *extra)
    assert message in r.stderr, r.stderr
    if "cannot act as" in message:  # checked as the user instead, with a one-line warning;
        assert "Quota limit" in r.stderr  # then it went on to create (which is refused here)
        return
    assert r.returncode == 2 and "tpu_vm.py: error:" in r.stderr.strip().splitlines()[-1]
    assert not [c for c in cloud.calls() if c[0] != "storage"]  # nothing rented


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
