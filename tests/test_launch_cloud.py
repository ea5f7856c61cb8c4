"""The TPU VM launcher against a fake gcloud (tests/fake_gcloud.py: exact calls, queued states,
ssh drops, preemptions, supervise's retries and stops)."""

import json
import os
import re
import subprocess
import tempfile
import time

import pytest

from t5lite.mesh import xla_flags

from launch_helpers import (
    BUCKET_CHECK, CAPACITY, JOB_ID, LAUNCH, QUOTA, TPUS, Z, describe, FakeCloud, presets, ssh_call,
    without_polls, worker_setup)


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
