"""A fake `gcloud` for tests/test_launch.py: records every call and plays a small TPU cloud.

State lives in $FAKE_CLOUD (a directory): cloud.json (resources, scripted queued-resource
states, ssh drops), calls.jsonl (one JSON argv per call; worker_calls.jsonl for the calls the
workers make), nodes/<name>/w<i>/ (each worker's
home, where `tpu-vm ssh` runs the command with bash), gcs/ (what `gcloud storage` writes).
Workers run `python3` / the venv's `python` from tests/fake_worker_python.py.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

FAKE = os.environ["FAKE_CLOUD"]
STATE = os.path.join(FAKE, "cloud.json")


def load():
    with open(STATE) as f:
        return json.load(f)


def save(state):
    # a temporary file per process: the launcher's polling and a worker's call can save at
    # the same moment, and a shared name let one replace the other's half-written file
    tmp = f"{STATE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, STATE)


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
            flags[k] = v or True
        else:
            pos.append(a)
        i += 1
    return flags, pos


def gcs_path(url):
    return os.path.join(FAKE, "gcs", url[len("gs://"):])


def node_dir(name):
    return os.path.join(FAKE, "nodes", name)


def make_node(state, name, acc, workers):
    state["nodes"][name] = {"state": "READY", "acc": acc, "workers": workers}
    if os.path.exists(os.path.join(FAKE, f"preempt-{name}")):  # the old slice's workers asked
        os.remove(os.path.join(FAKE, f"preempt-{name}"))
    for w in range(workers):
        os.makedirs(os.path.join(node_dir(name), f"w{w}"), exist_ok=True)


def drop_node(state, name):
    state["nodes"].pop(name, None)
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


def preempted(state, name):
    """A worker's trainer asked for this slice to be preempted (tests' 'lost' action)."""
    flag = os.path.join(FAKE, f"preempt-{name}")
    if os.path.exists(flag) and name in state["nodes"]:
        os.remove(flag)
        state["nodes"][name]["state"] = "PREEMPTED"
        return True
    return False


def kill_worker_jobs(name, workers):
    for w in range(workers):
        pidf = os.path.join(node_dir(name), f"w{w}", "t5lite-job", "pid")
        try:
            os.killpg(int(open(pidf).read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def ssh(state, name, flags):
    n = state["nodes"].get(name)
    if n is None or n["state"] != "READY":
        fail("ssh: connect to host 10.0.0.0 port 22: Connection timed out", 255)
    workers = range(n["workers"]) if flags["worker"] == "all" else [int(flags["worker"])]
    cmd = flags["command"]
    drop = "tpu_job.sh run" in cmd and take_flag("drop-ssh")
    if "tpu_job.sh run" in cmd:  # the workers' trainers play plan[run - 1]: all alike
        state["train_runs"] = state.get("train_runs", 0) + 1
    save(state)

    def start():
        procs = []
        for w in workers:
            home = os.path.join(node_dir(name), f"w{w}")
            env = {"PATH": os.pathsep.join([os.path.join(FAKE, "workerbin"),
                                            os.path.join(FAKE, "bin"), "/usr/bin", "/bin"]),
                   "HOME": home, "T5LITE_WORKER": str(w), "FAKE_CLOUD": FAKE,
                   "FAKE_NODE": name, "FAKE_RUN": str(state.get("train_runs", 0)),
                   "T5LITE_TPU_LOCKFILE": os.path.join(home, "libtpu_lockfile")}
            # a fresh ssh session starts with SIGHUP at its default action; a runner that
            # ignores SIGHUP (inherited SIG_IGN, which bash cannot trap or reset) otherwise made
            # the drop below wait for the whole job, and the retry re-ran it
            procs.append(subprocess.Popen(
                ["bash", "-c", cmd], cwd=home, env=env, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)))
        return procs

    procs = start()
    if drop:  # the connection drops once the job runs; gcloud runs the command again
        # (waiting for the job's pid file, not a fixed time; the "long" job runs 10 s, so it
        # still runs when the retry comes: under CI load a 3 s job had ended before the drop)
        pidfs = [os.path.join(node_dir(name), f"w{w}", "t5lite-job", "pid") for w in workers]
        deadline = time.time() + 120
        while not all(os.path.exists(f) for f in pidfs) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        for p in procs:
            os.killpg(p.pid, signal.SIGHUP)
            p.wait()
        print("Connection to 10.0.0.0 closed by remote host. Retrying.", flush=True)
        procs = start()
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
        st = load()
        if preempted(st, name):
            save(st)
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            kill_worker_jobs(name, n["workers"])
            fail("Connection to 10.0.0.0 closed by remote host.", 255)
    rcs = [p.wait() for p in procs]
    sys.exit(next((rc for rc in rcs if rc), 0))


def main():
    argv = sys.argv[1:]
    on_worker = "FAKE_NODE" in os.environ  # called by the job on a worker, not by the launcher
    with open(os.path.join(FAKE, "worker_calls.jsonl" if on_worker else "calls.jsonl"), "a") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:1] == ["alpha"]:
        argv = argv[1:]
    flags, pos = parse(argv)
    state = load()
    if pos[:2] == ["storage", "cp"]:
        dst = gcs_path(pos[3])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(pos[2], dst)
        return
    if pos[:2] == ["storage", "cat"]:
        import glob
        for path in sorted(glob.glob(gcs_path(pos[2]))):
            sys.stdout.write(open(path).read())
        return
    assert pos[:2] == ["compute", "tpus"], argv
    kind, verb, name = pos[2], pos[3], pos[4] if len(pos) > 4 else ""
    qrs, nodes = state["queued"], state["nodes"]
    if kind == "queued-resources":
        if verb == "create":
            if name in qrs:
                fail(f"ERROR: (gcloud) ALREADY_EXISTS: {name}")
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
        save(state)
        return
    if verb == "create":
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
    elif verb == "scp":
        src, dst = pos[4], pos[5]
        node, _, rel = dst.partition(":")
        for w in range(nodes[node]["workers"]):
            shutil.copyfile(src, os.path.join(node_dir(node), f"w{w}", rel))
    elif verb == "ssh":
        save(state)
        ssh(state, name, flags)
    save(state)


if __name__ == "__main__":
    main()
