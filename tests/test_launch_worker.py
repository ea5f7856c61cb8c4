"""The TPU launcher's worker side on a bare TPU image (tests/bare_worker/): setup's real script,
the first `t5lite train` in the venv it makes, data copied from the launching machine (never
built on a worker), and the one-line error when a worker's data is missing."""

import os
import socket
import subprocess
import sys
import tarfile

import pytest

import tasks_testdata
from bare_worker import image, wheelhouse
from launch_helpers import ROOT, Z, FakeCloud, _load_tpu_module, describe, ssh_call

worker_setup = _load_tpu_module("worker_setup")
data_ship = _load_tpu_module("data_ship")
layout = _load_tpu_module("layout")

# configs/quickstart.py (whose train.prepare_data asks for corpus and vocab_sp8k), made tiny
TINY = ["model.vocab_size=768", "model.d_model=32", "model.num_heads=4", "model.head_dim=8",
        "model.d_ff=64", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
        "data.feature_lengths={'inputs': 32, 'targets': 8}", "data.batch_size=8",
        "train.steps=2", "train.log_every=1", "train.eval_every=0", "train.eval_steps=0",
        "checkpoint.every_steps=2"]


def prepared_data_dir(root) -> str:
    """tests/tasks_testdata.py's small data dir with the MANIFEST.json `t5lite data prepare`
    writes for corpus and vocab_sp8k (real recipes, file sizes and hashes; vocab_sp8k built
    from this corpus), so is_prepared holds there as after a real prepare."""
    from t5lite.dataprep import DATASETS, manifest
    root = tasks_testdata.make_data_dir(str(root))
    files = {"corpus": ["corpus/train.txt", "corpus/validation.txt"],
             "vocab_sp8k": ["vocab/t5lite_sp8k.model"]}
    entries = {name: {"recipe": DATASETS[name].recipe, "sources": {}, "stats": {},
                      "seconds": 0.0, "built": "", "files": {
                          rel: manifest.file_info(os.path.join(root, rel)) for rel in rels}}
               for name, rels in files.items()}
    entries["vocab_sp8k"]["sources"]["corpus"] = {
        "sha256": entries["corpus"]["files"]["corpus/train.txt"]["sha256"]}
    manifest.write_manifest(root, {"format": 1, "datasets": entries})
    return root


def bundle(archive, data_dir, *names):
    """The launching machine's part of `data` / `setup --data` (data_ship.pack_and_copy)."""
    return subprocess.run([sys.executable, "-m", "t5lite.dataprep.bundle", str(archive), *names],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "T5LITE_DATA_DIR": str(data_dir)})


def ship_working_tree(home) -> None:
    """What `setup` scp's: the checkout as an archive (here its working tree, which CI's fresh
    clone makes equal to HEAD, so the test checks the code being committed)."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True).stdout
    with tarfile.open(os.path.join(home, "t5lite-src.tar.gz"), "w:gz", compresslevel=1) as tar:
        for rel in files.split("\0"):
            if rel and os.path.isfile(os.path.join(ROOT, rel)):
                tar.add(os.path.join(ROOT, rel), arcname=rel)


def on_worker(env, script, timeout=300):
    """`gcloud ... ssh --command SCRIPT` on the bare worker: bash in its home."""
    return subprocess.run(["bash", "-c", script], cwd=env["HOME"], env=env, capture_output=True,
                          text=True, timeout=timeout)


def train_line(env, job_id, workdir):
    """What `train` sends (launch/tpu/job.py): tpu_job.sh running `t5lite train` in the venv
    with mesh.multihost=true; the coordinator (one local process) and the CPU platform come
    by --env, as a user would pass them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sets = " ".join(f"--set \"{item}\"" for item in TINY)
    return (f"bash {layout.REMOTE_DIR}/launch/tpu_job.sh run --job-id {job_id} -- env "
            f"JAX_PLATFORMS=cpu T5LITE_COORDINATOR=127.0.0.1:{port} T5LITE_NUM_PROCESSES=1 "
            f"T5LITE_PROCESS_ID=0 {layout.VENV_PYTHON} -m t5lite.cli train "
            f"--config=configs/quickstart.py --workdir={workdir} --set mesh.multihost=true "
            f"{sets}")


def test_bare_worker_setup_then_first_train(tmp_path):
    """setup's script on a fresh TPU image, for real (uv from the index stand-in, a venv
    without pip, t5lite[tpu] resolved and installed offline); the first `train` there stops at
    once on the missing data, naming the launcher command that copies it; after the copy it
    trains 2 steps and saves its checkpoint."""
    wheels = wheelhouse.build(str(tmp_path / "index"))
    env = image.make(str(tmp_path / "image"), wheels)
    home = env["HOME"]
    r = on_worker(env, "command -v npm node; apt-get download python3.11-doc")
    assert r.stdout == "" and r.returncode == 100, r.stdout + r.stderr
    assert "Unable to locate package python3.11-doc" in r.stderr

    ship_working_tree(home)
    version, _ = image.venv_python()
    r = on_worker(env, worker_setup.setup_script(worker_setup.unpack_code_line(),
                                                 python=version))
    assert r.returncode == 0 and "t5lite-setup: ok" in r.stdout, r.stdout + r.stderr[-3000:]
    # what setup used to run there fails as on a real worker: the uv venv has no pip (and
    # the image no npm, no apt lists)
    r = on_worker(env, f"cd {layout.REMOTE_DIR} && {layout.VENV_PYTHON} -m t5lite.cli data "
                       "prepare vocab_t5 --data-dir ~/scratch")
    assert r.returncode == 2 and "No module named pip" in r.stderr, r.stdout + r.stderr

    workdir = tmp_path / "run"
    r = on_worker(env, train_line(env, "J1", workdir))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "t5lite-job: worker 0 exit 2"
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("t5lite: error:")]
    assert len(errors) == 1 and errors[0].endswith(
        "this machine does not build data ($T5LITE_DATA_FROM): copy it here with "
        "`python launch/tpu_vm.py data TPU_NAME corpus vocab_sp8k`."), r.stdout
    assert "compil" not in r.stdout.lower() and not (workdir / "checkpoints").exists()

    data_dir = prepared_data_dir(tmp_path / "data")
    archive = os.path.join(home, layout.DATA_ARCHIVE)  # where gcloud scp puts it
    r = bundle(archive, data_dir, "vocab_sp8k")
    assert r.returncode == 0, r.stderr
    assert "packed corpus, vocab_sp8k" in r.stderr
    r = on_worker(env, data_ship.unpack_line())
    assert r.stdout.strip() == data_ship.OK, r.stdout + r.stderr
    assert not os.path.exists(archive)
    r = on_worker(env, train_line(env, "J2", workdir), timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "t5lite-job: worker 0 exit 0"
    assert "train: 2/2 (100%)" in r.stdout, r.stdout[-3000:]
    assert (workdir / "checkpoints" / "2" / "commit_success.txt").exists()


TPUS = ["compute", "tpus"]


def test_data_is_built_here_and_copied_to_every_worker(tmp_path, monkeypatch):
    """`data` and `setup --data`: packed here from this machine's data dir, one scp to all
    workers, unpacked into each worker's ~/.cache/t5lite (t5lite's default data dir), where
    the datasets then count as prepared; a wrong name stops before anything is copied."""
    from t5lite.dataprep import is_prepared
    data_dir = prepared_data_dir(tmp_path / "data")
    monkeypatch.setenv("T5LITE_DATA_DIR", data_dir)
    cloud = FakeCloud(tmp_path)
    assert cloud.run("create", "pod", *Z, "--accelerator-type=v4-16", "--no-queued").returncode == 0
    cloud.calls()
    r = cloud.run("data", "pod", *Z, "vocab_sp8k")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = cloud.calls()
    archive = calls[1][4]  # a file of this run's own, removed after the copy
    assert calls == [describe("tpu-vm", "pod"),
                     [*TPUS, "tpu-vm", "scp", archive, "pod:t5lite-data.tar.gz", "--worker=all",
                      *Z],
                     ssh_call("pod", data_ship.unpack_line())]
    assert not os.path.exists(archive)
    assert "packed corpus, vocab_sp8k" in r.stderr and "on all 2 worker(s)" in r.stderr
    for w in (0, 1):
        home = cloud.worker("pod", w)
        worker_data = home / ".cache" / "t5lite"
        for rel in ("corpus/train.txt", "corpus/validation.txt", "vocab/t5lite_sp8k.model"):
            assert (worker_data / rel).read_bytes() == open(os.path.join(data_dir, rel),
                                                            "rb").read()
        assert not (home / layout.DATA_ARCHIVE).exists()
        assert is_prepared("vocab_sp8k", str(worker_data))
        assert is_prepared("corpus", str(worker_data))
        assert not is_prepared("sentiment", str(worker_data))  # only what was asked for

    r = cloud.run("setup", "pod", *Z, "--data=corpus")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = cloud.calls()
    assert [c[2:4] for c in calls] == [["tpu-vm", "describe"], ["tpu-vm", "scp"],
                                       ["tpu-vm", "scp"], ["tpu-vm", "ssh"]]
    assert calls[1][5] == "pod:t5lite-data.tar.gz" and calls[2][5] == "pod:t5lite-src.tar.gz"
    assert calls[3] == ssh_call("pod", worker_setup.setup_script(
        worker_setup.unpack_code_line(), data_ship.unpack_line()))
    assert not [i for i in cloud.jsonl("installs.jsonl") if "prepare" in i["argv"]]

    r = cloud.run("data", "pod", *Z, "vocab_sp8", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown dataset 'vocab_sp8'. Did you mean vocab_sp8k" in r.stderr
    assert [c[2:4] for c in cloud.calls()] == [["tpu-vm", "describe"]]  # nothing copied
    r = cloud.run("setup", "pod", *Z, "--data=corpus,vocab_sp8", timeout=120)
    assert r.returncode == 2 and "Did you mean vocab_sp8k" in r.stderr
    assert [c[2:4] for c in cloud.calls()] == [["tpu-vm", "describe"]]
    r = cloud.run("setup", "pod", *Z, "--prepare-data")
    assert r.returncode == 2 and "--data=NAME" in r.stderr


def test_missing_data_on_a_machine_that_only_receives_it(tmp_path, monkeypatch):
    """With $T5LITE_DATA_FROM (tpu_job.sh sets it on workers) missing data is one UserError
    naming the copy command, and never a build; without it, the `t5lite data prepare` hint."""
    from t5lite import dataprep
    from t5lite.dataprep import build
    from t5lite.errors import UserError
    monkeypatch.setattr(build, "prepare", lambda *a, **k: pytest.fail("built data here"))
    monkeypatch.setenv("T5LITE_DATA_FROM", "python launch/tpu_vm.py data my-tpu")
    with pytest.raises(UserError) as e:
        dataprep.ensure_prepared(["quickstart"], str(tmp_path))
    assert str(e.value) == (
        f"corpus, sentiment, vocab_sp8k are not in {tmp_path}, and this machine does not build "
        "data ($T5LITE_DATA_FROM): copy it here with `python launch/tpu_vm.py data my-tpu "
        "corpus sentiment vocab_sp8k`.")
    with pytest.raises(UserError) as e:
        dataprep.require("vocab_t5", "vocab/t5_spiece.model", str(tmp_path))
    assert str(e.value).startswith(f"vocab/t5_spiece.model is not in {tmp_path}, and this ")
    assert str(e.value).endswith("`python launch/tpu_vm.py data my-tpu vocab_t5`.")
    monkeypatch.delenv("T5LITE_DATA_FROM")
    with pytest.raises(UserError) as e:
        dataprep.require("vocab_t5", "vocab/t5_spiece.model", str(tmp_path))
    assert str(e.value).startswith(f"vocab/t5_spiece.model is not prepared in {tmp_path}. Run "
                                   "`t5lite data prepare vocab_t5`")
