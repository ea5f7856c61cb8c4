"""Stands in for `python3` and the venv's `python` on the fake TPU workers (tests/fake_gcloud.py).

`-m pip` / `-m uv pip` are recorded; `-m uv venv DIR` makes DIR/bin/python (this script);
`-m t5lite.cli train` records its start and environment and plays action $FAKE_RUN (the
launcher's n-th `train` ssh) of $FAKE_CLOUD/plan.json:
ok (a few steps, exit 0), preempt (exit 75), fail (exit 1), long (10 s of steps, exit 0),
slow, lost and hang (steps until ended: SIGTERM gives "checkpoint saved" and exit 75, as every
action does; for lost and hang, tests/fake_gcloud.py preempts the slice under it once every
worker has started).
"""

import json
import os
import shutil
import signal
import sys
import time

FAKE = os.environ["FAKE_CLOUD"]
WORKER = os.environ.get("T5LITE_WORKER", "?")


def record(name, **item):
    with open(os.path.join(FAKE, name), "a") as f:
        f.write(json.dumps({"worker": WORKER, "node": os.environ.get("FAKE_NODE"), **item}) + "\n")


def train(argv):
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("TPU_", "TENSORSTORE_", "LIBTPU_", "MY_"))}
    record("starts.jsonl", argv=argv, run=os.environ["FAKE_RUN"], env=env)
    plan = json.load(open(os.path.join(FAKE, "plan.json")))
    action = plan[min(int(os.environ["FAKE_RUN"]) - 1, len(plan) - 1)]  # a slice's workers alike
    step = 0

    def term(*_):
        print(f"preempted at step {step}: checkpoint saved; rerun the same command to resume",
              flush=True)
        sys.exit(75)

    signal.signal(signal.SIGTERM, term)
    steps = {"slow": 600, "lost": 600, "hang": 600, "long": 100}.get(action, 3)
    for step in range(1, steps + 1):
        print(f"step {step} loss {4.0 / step:.2f}", flush=True)
        time.sleep(0.1)
    if action == "preempt":
        term()
    if action == "fail":
        print("Traceback (most recent call last):\nValueError: boom", flush=True)
        sys.exit(1)
    print("done: reached the last step", flush=True)


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["-c"]:
        return
    if argv[:2] == ["-m", "uv"] and argv[2] == "venv":
        bindir = os.path.join(argv[-1], "bin")
        os.makedirs(bindir, exist_ok=True)
        shutil.copy(__file__, os.path.join(bindir, "python"))
        record("installs.jsonl", argv=argv)
        return
    if argv[:2] in (["-m", "pip"], ["-m", "uv"]):
        record("installs.jsonl", argv=argv)
        return
    if argv[:4] == ["-m", "t5lite.cli", "data", "prepare"]:
        record("installs.jsonl", argv=argv)
        return
    if argv[:3] == ["-m", "t5lite.cli", "train"]:
        return train(argv[3:])
    sys.exit(f"fake python: unexpected {argv}")


if __name__ == "__main__":
    main()
