"""What the launcher tests share: launch/ modules imported by path, the launcher run
as a subprocess, the shell presets a worker gets, and FakeCloud (tests/fake_gcloud.py on PATH
with fake ssh-agent tools and fake workers)."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time


from t5lite.mesh import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")


def _load(name):
    spec = importlib.util.spec_from_file_location(
        "launch_" + name, os.path.join(LAUNCH, name + ".py"))
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


JOB_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"
ALIVE = "--ssh-flag=-oServerAliveInterval=30 --ssh-flag=-oServerAliveCountMax=4"
KEEPALIVE = ALIVE.split()
PRESETS = ("env TPU_MIN_LOG_LEVEL=0 TPU_STDERR_LOG_LEVEL=1 "
           "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS=60 TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES=256")


def presets(generation: str) -> str:
    """PRESETS and the generation's LIBTPU_INIT_ARGS (t5lite/mesh/xla_flags.py), shell-quoted."""
    return f"{PRESETS} " + shlex.quote(f"LIBTPU_INIT_ARGS={xla_flags.libtpu_init_args(generation)}")

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


# gcloud's words for a zone out of capacity and for a quota (retry.failure_kind reads them)
CAPACITY = ('ERROR: (gcloud.compute.tpus.tpu-vm.create) {"code": 8, "message": "There is no '
            'more capacity in the zone \\"us-central2-b\\"; you can try in another zone"}')
QUOTA = ("ERROR: (gcloud.compute.tpus.tpu-vm.create) RESOURCE_EXHAUSTED: Quota limit "
         "'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.")
