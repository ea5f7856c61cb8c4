"""A fake `gcloud` for the launcher tests (FakeCloud in tests/launch_helpers.py): records every
call and plays a small TPU cloud.

State lives in $FAKE_CLOUD (a directory): cloud.json (resources, scripted queued-resource
states, scripted failures), calls.jsonl (one JSON argv per call; worker_calls.jsonl for the
calls the workers make), nodes/<name>/w<i>/ (each worker's home, where `tpu-vm ssh` runs the
command with bash), gcs/<bucket>/ (a bucket exists when its folder does; `gcloud storage`).
Workers run `python3` / the venv's `python` from tests/fake_worker_python.py.

Like gcloud it refuses flags a verb does not have and the combinations gcloud refuses. Scripted
in cloud.json: "create_errors" (stderr of the next creates to fail, e.g. a capacity error),
"conn_failures" ({"ssh": n, "scp": n}: the next n connections time out), "impersonable" (the
service accounts the user may act as), "writers" ({bucket: identities allowed to write}).
A worker whose plan action is "lost" or "hang" gets its slice preempted by the cloud once every
worker's trainer has started that run: "lost" ends the ssh with 255; "hang" leaves it open, as a
silently dead host does, until ssh's keepalive (--ssh-flag ServerAlive*) gives up, if any.
"""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

FAKE = os.environ["FAKE_CLOUD"]
STATE = os.path.join(FAKE, "cloud.json")
# gcloud's flags per verb (GA; `alpha` adds the ssh/scp IAP tunnel and --best-effort), only
# those the launcher could use; anything else is "unrecognized arguments", as in gcloud.
WHERE = {"zone", "project", "impersonate-service-account", "format", "quiet"}
CREATE = {"accelerator-type", "network", "subnetwork", "service-account", "scopes", "metadata",
          "internal-ips", "spot", "reserved", "preemptible"}
FLAGS = {
    ("tpu-vm", "create"): CREATE | {"version"},
    ("queued-resources", "create"): CREATE - {"preemptible"} | {"node-id", "runtime-version"},
    ("tpu-vm", "ssh"): {"worker", "command", "internal-ip", "ssh-flag", "strict-host-key-checking"},
    ("tpu-vm", "scp"): {"worker", "internal-ip", "scp-flag", "recurse", "compress"},
    ("queued-resources", "delete"): {"force", "async"},
}
ALPHA_FLAGS = {("tpu-vm", "ssh"): {"tunnel-through-iap", "batch-size"},
               ("tpu-vm", "scp"): {"tunnel-through-iap", "batch-size"},
               ("queued-resources", "create"): {"best-effort"}}


def load():
    with open(STATE) as f:
        return json.load(f)


def save(state):
    tmp = f"{STATE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, STATE)


@contextlib.contextmanager
def transaction():
    """The state, read and written back under a lock: the launcher's polling, the ssh that
    plays the job and the cloud's preemption change it from different processes."""
    with open(STATE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load()
        try:
            yield state
        finally:  # a scripted failure that was used up stays used up when the call fails
            save(state)


def fail(msg, rc=1):
    print(msg, file=sys.stderr)
    sys.exit(rc)


def parse(argv):
    flags, pos, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--command":
            flags["command"], i = argv[i + 1], i + 2
            continue
        if a.startswith("--"):
            k, _, v = a[2:].partition("=")
            if k in ("ssh-flag", "scp-flag"):
                flags.setdefault(k, []).append(v)
            else:
                flags[k] = v or True
        else:
            pos.append(a)
        i += 1
    return flags, pos


def check_flags(alpha, kind, verb, flags):
    """gcloud's argument parser: unknown flags and --internal-ip with --tunnel-through-iap."""
    track = "alpha." if alpha else ""
    known = FLAGS.get((kind, verb), set()) | WHERE
    if alpha:
        known |= ALPHA_FLAGS.get((kind, verb), set())
    unknown = [f"--{k}" for k in flags if k not in known]
    if unknown:
        fail(f"ERROR: (gcloud.{track}compute.tpus.{kind}.{verb}) unrecognized arguments: "
             + " ".join(unknown), 2)
    if "internal-ip" in flags and "tunnel-through-iap" in flags:
        fail(f"ERROR: (gcloud.{track}compute.tpus.{kind}.{verb}) argument --internal-ip: At "
             "most one of --internal-ip | --tunnel-through-iap may be specified.", 2)


def scripted_failure(state, key, tool=None):
    """Pops the next scripted failure: a create's stderr, or True for a connection."""
    if tool is None:
        errors = state.get(key) or []
        return errors.pop(0) if errors else None
    left = (state.get(key) or {}).get(tool, 0)
    if left:
        state[key][tool] = left - 1
        return True
    return None


def gcs_path(url):
    return os.path.join(FAKE, "gcs", url[len("gs://"):])


def node_dir(name):
    return os.path.join(FAKE, "nodes", name)


def make_node(state, name, acc, workers):
    state["nodes"][name] = {"state": "READY", "acc": acc, "workers": workers}
    for w in range(workers):
        os.makedirs(os.path.join(node_dir(name), f"w{w}"), exist_ok=True)


def drop_node(state, name):
    n = state["nodes"].pop(name, None)
    if n:  # the VMs go, and with them whatever ran on them
        kill_worker_jobs(name, n["workers"])
    shutil.rmtree(node_dir(name), ignore_errors=True)  # a new VM gets a fresh disk


def node_json(n):
    return {"state": n["state"], "acceleratorType": n["acc"], "health": "HEALTHY",
            "networkEndpoints": [{"ipAddress": f"10.0.0.{w}"} for w in range(n["workers"])]}


def take_flag(name):
    """True once per flag file a test wrote: removing it is atomic, so no stale copy of the
    JSON state that another gcloud process saves can bring it back or lose it."""
    try:
        os.remove(os.path.join(FAKE, name))
        return True
    except FileNotFoundError:
        return False


def run_action(run):
    plan = json.load(open(os.path.join(FAKE, "plan.json")))
    return plan[min(run - 1, len(plan) - 1)]


def all_started(name, run, workers):
    """Every worker's trainer recorded its start of this run (tests/fake_worker_python.py)."""
    try:
        with open(os.path.join(FAKE, "starts.jsonl")) as f:
            starts = [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return False
    return len({s["worker"] for s in starts if s["node"] == name
                and s["run"] == str(run)}) >= workers


def preempt(name, run):
    """The cloud preempts the slice (its workers die) once every trainer of `run` started."""
    with transaction() as state:
        n = state["nodes"].get(name)
        if n is None or n["state"] != "READY" or not all_started(name, run, n["workers"]):
            return False
        n["state"] = "PREEMPTED"
        kill_worker_jobs(name, n["workers"])
        return True


def kill_worker_jobs(name, workers):
    for w in range(workers):
        pidf = os.path.join(node_dir(name), f"w{w}", "t5lite-job", "pid")
        try:
            os.killpg(int(open(pidf).read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def keepalive_seconds(flags):
    """How long ssh waits on a silent host: ServerAliveInterval x ServerAliveCountMax."""
    opts = dict(f.removeprefix("-o").split("=", 1) for f in flags.get("ssh-flag", [])
                if f.startswith("-o") and "=" in f)
    if "ServerAliveInterval" not in opts:
        return None
    return int(opts["ServerAliveInterval"]) * int(opts.get("ServerAliveCountMax", 3))


def start_workers(name, workers, cmd, run):
    procs = []
    for w in workers:
        home = os.path.join(node_dir(name), f"w{w}")
        env = {"PATH": os.pathsep.join([os.path.join(FAKE, "workerbin"),
                                        os.path.join(FAKE, "bin"), "/usr/bin", "/bin"]),
               "HOME": home, "T5LITE_WORKER": str(w), "FAKE_CLOUD": FAKE,
               "FAKE_NODE": name, "FAKE_RUN": str(run),
               "T5LITE_TPU_LOCKFILE": os.path.join(home, "libtpu_lockfile")}
        # a fresh ssh session starts with SIGHUP at its default action; a runner that
        # ignores SIGHUP (inherited SIG_IGN, which bash cannot trap or reset) otherwise made
        # the drop below wait for the whole job, and the retry re-ran it
        procs.append(subprocess.Popen(
            ["bash", "-c", cmd], cwd=home, env=env, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)))
    return procs


def drop_connection(name, workers, procs, cmd, run):
    """The connection drops once the job runs; gcloud runs the command again (waiting for
    the job's pid file, not a fixed time: the "long" job still runs when the retry comes)."""
    pidfs = [os.path.join(node_dir(name), f"w{w}", "t5lite-job", "pid") for w in workers]
    deadline = time.time() + 120
    while not all(os.path.exists(f) for f in pidfs) and time.time() < deadline:
        time.sleep(0.1)
    for p in procs:
        os.killpg(p.pid, signal.SIGHUP)
        p.wait()
    print("Connection to 10.0.0.0 closed by remote host. Retrying.", flush=True)
    return start_workers(name, workers, cmd, run)


def ssh(name, flags):
    with transaction() as state:
        n = state["nodes"].get(name)
        if n is None or n["state"] != "READY" or scripted_failure(state, "conn_failures", "ssh"):
            fail("ssh: connect to host 10.0.0.0 port 22: Connection timed out", 255)
        cmd = flags["command"]
        is_job = "tpu_job.sh run" in cmd
        if is_job:  # the workers' trainers play plan[run - 1]: all alike
            state["train_runs"] = state.get("train_runs", 0) + 1
        run = state.get("train_runs", 0)
    workers = range(n["workers"]) if flags["worker"] == "all" else [int(flags["worker"])]
    procs = start_workers(name, workers, cmd, run)
    if is_job and take_flag("drop-ssh"):
        procs = drop_connection(name, workers, procs, cmd, run)
    action = run_action(run) if is_job else None
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
        if action in ("lost", "hang") and preempt(name, run):
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            if action == "hang":  # nothing more comes back; only a keepalive notices
                time.sleep(keepalive_seconds(flags) or 3600)
                fail("Timeout, server 10.0.0.0 not responding.", 255)
            fail("Connection to 10.0.0.0 closed by remote host.", 255)
    rcs = [p.wait() for p in procs]
    sys.exit(next((rc for rc in rcs if rc), 0))


def scp(name, flags, pos):
    with transaction() as state:
        n = state["nodes"].get(name)
        if n is None or n["state"] != "READY" or scripted_failure(state, "conn_failures", "scp"):
            fail("ssh: connect to host 10.0.0.0 port 22: Connection timed out\n"
                 "lost connection", 255)
    src, dst = pos[4], pos[5]
    rel = dst.partition(":")[2]
    for w in range(n["workers"]):
        shutil.copyfile(src, os.path.join(node_dir(name), f"w{w}", rel))


def storage(flags, pos):
    """gcloud storage buckets describe / cp (a file or - for stdin) / cat / rm. A bucket
    exists when gcs/<bucket>/ does; writers[bucket] lists who may write (default: anyone);
    --impersonate-service-account works for the accounts in impersonable."""
    state = load()
    who = flags.get("impersonate-service-account")
    verb = " ".join(pos[1:3]) if pos[1] == "buckets" else pos[1]
    if who and who not in state.get("impersonable", []):
        fail(f"ERROR: (gcloud.storage.{verb.replace(' ', '.')}) Failed to impersonate [{who}]. "
             "Make sure the account that's trying to impersonate it has access to the service "
             "account itself and the \"roles/iam.serviceAccountTokenCreator\" role.")
    bucket = pos[-1][len("gs://"):].split("/", 1)[0]
    if not os.path.isdir(os.path.join(FAKE, "gcs", bucket)):
        fail(f"ERROR: (gcloud.storage.{verb.split()[0]}) gs://{bucket} not found: 404.")
    writers = state.get("writers", {}).get(bucket)
    if verb in ("cp", "rm") and writers is not None and (who or "user") not in writers:
        fail(f"ERROR: (gcloud.storage.{verb}) HTTPError 403: {who or 'user@example.com'} does "
             f"not have storage.objects.create access to the Google Cloud Storage object.")
    if verb == "buckets describe":
        print(json.dumps({"name": bucket}))
    elif verb == "cp":
        dst = gcs_path(pos[3])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if pos[2] == "-":
            with open(dst, "w") as f:
                f.write(sys.stdin.read())
        else:
            shutil.copyfile(pos[2], dst)
    elif verb == "cat":
        import glob
        paths = sorted(glob.glob(gcs_path(pos[2])))
        if not paths:
            fail(f"ERROR: (gcloud.storage.cat) The following URLs matched no objects or "
                 f"files:\n{pos[2]}")
        for path in paths:
            sys.stdout.write(open(path).read())
    elif verb == "rm":
        os.remove(gcs_path(pos[2]))


def queued(state, flags, verb, name):
    qrs, nodes = state["queued"], state["nodes"]
    if verb == "create":
        if name in qrs:
            fail(f"ERROR: (gcloud) ALREADY_EXISTS: {name}")
        error = scripted_failure(state, "create_errors")
        if error:
            fail(error)
        plan = list(state.get("qr_plan") or ["ACTIVE"])
        qrs[name] = {"state": "ACCEPTED", "plan": plan, "acc": flags["accelerator-type"]}
    elif verb == "describe":
        q = qrs.get(name)
        if q is None:
            fail(f"ERROR: (gcloud) NOT_FOUND: Resource 'queuedResources/{name}' was not found")
        if q["plan"]:
            q["state"] = q["plan"].pop(0)
        n = nodes.get(name)
        if n and n["state"] == "PREEMPTED":
            q["state"] = "SUSPENDED"
        if q["state"] == "ACTIVE" and n is None:
            make_node(state, name, q["acc"], state["workers"][q["acc"]])
        out = {"state": {"state": q["state"]}}
        if q["state"] == "FAILED":
            out["state"]["failedData"] = {"error": {"code": 8, "message": state["fail_reason"]}}
        if q["state"] == "SUSPENDED":
            out["state"]["stateInitiator"] = "SERVICE"
        print(json.dumps(out))
    elif verb == "delete":
        if name not in qrs:
            fail(f"ERROR: (gcloud) NOT_FOUND: {name}")
        del qrs[name]
        drop_node(state, name)


def tpu_vm(state, flags, verb, name):
    nodes = state["nodes"]
    if verb == "create":
        error = scripted_failure(state, "create_errors")
        if error:
            fail(error)
        make_node(state, name, flags["accelerator-type"],
                  state["workers"][flags["accelerator-type"]])
    elif verb == "describe":
        n = nodes.get(name)
        if n is None:
            fail(f"ERROR: (gcloud) NOT_FOUND: Resource 'nodes/{name}' was not found")
        print(json.dumps(node_json(n)) if flags.get("format") == "json" else f"state: {n['state']}")
    elif verb == "delete":
        if name not in nodes:
            fail(f"ERROR: (gcloud) NOT_FOUND: {name}")
        drop_node(state, name)
    elif verb in ("stop", "start"):
        nodes[name]["state"] = "STOPPED" if verb == "stop" else "READY"


def main():
    argv = sys.argv[1:]
    on_worker = "FAKE_NODE" in os.environ  # called by the job on a worker, not by the launcher
    with open(os.path.join(FAKE, "worker_calls.jsonl" if on_worker else "calls.jsonl"), "a") as f:
        f.write(json.dumps(argv) + "\n")
    alpha = argv[:1] == ["alpha"]
    flags, pos = parse(argv[1:] if alpha else argv)
    if pos[:1] == ["storage"]:
        return storage(flags, pos)
    assert pos[:2] == ["compute", "tpus"], argv
    kind, verb, name = pos[2], pos[3], pos[4] if len(pos) > 4 else ""
    check_flags(alpha, kind, verb, flags)
    if verb == "ssh":
        return ssh(name, flags)
    if verb == "scp":
        return scp(pos[5].partition(":")[0], flags, pos)
    with transaction() as state:
        (queued if kind == "queued-resources" else tpu_vm)(state, flags, verb, name)


if __name__ == "__main__":
    main()
