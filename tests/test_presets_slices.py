"""Every config under configs/ states the TPU slice it is meant for (mesh.topology), its
shipped mesh shards the training state over that slice and still resolves on one CPU device
(a tensor-parallel one on 8, and refuses one device in one line),
and `t5lite compile` / `t5lite train` say in one line when a mesh copies multi-GB state on
every chip (t5lite.tpu.advice; issue 34 item 2)."""

import json

import pytest

from t5lite import config as config_lib
from t5lite.cli import main as cli
from t5lite.errors import UserError
from t5lite.mesh import advice, topology as tpu_topology
from t5lite.mesh.topology import GiB
from t5lite.mesh import partitioning

CONFIGS = sorted(n for n in config_lib.available_configs() if "/" not in n)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_states_a_slice_its_mesh_and_batch_divide(name):
    cfg = config_lib.load_config(name)
    topo = tpu_topology.parse_topology(cfg.mesh.topology)  # a UserError names a bad one
    assert topo.chip.name in tpu_topology.CHIPS
    data, fsdp, tensor = partitioning.mesh_shape(cfg.mesh, topo.chips)
    accum = cfg.train.grad_accum_steps
    assert cfg.data.batch_size % (data * fsdp * accum) == 0, (name, data, fsdp, accum)
    if topo.chips > 1:  # the state sharded over every chip, or (where --search ranks the
        # copies first: presets.Slice(parallel="data")) copied on each of the data axis
        assert data * fsdp * tensor == topo.chips and 1 in (data, fsdp), (name, data, fsdp,
                                                                          tensor)
    if tensor == 1:  # the same mesh on one CPU (or GPU) device: one device, nothing refused
        assert partitioning.mesh_shape(cfg.mesh, 1) == (1, 1, 1)
    else:  # a tensor-parallel slice's mesh (XXL): one device is refused in one line that
        # says how to reset it, and 8 devices (a GPU box) resolve around the tensor axis
        with pytest.raises(UserError, match="--set mesh.tensor=1"):
            partitioning.mesh_shape(cfg.mesh, 1)
        assert partitioning.mesh_shape(cfg.mesh, 8) == ((1, 8 // tensor, tensor) if data == 1
                                                        else (8 // tensor, 1, tensor))


def test_the_models_listing_shows_each_slice():
    from t5lite.cli import listings
    table = listings.models_table(["t5_1_1_xl", "bert_base", "t5_1_1_tiny"])
    rows = {line.split()[0]: line for line in table.splitlines()}
    assert "TPU slice" in table and rows["t5_1_1_xl"].rstrip().endswith("v5p-64")
    assert rows["bert_base"].rstrip().endswith("v5p-8")


def test_mesh_advice_is_one_line_only_for_multi_gb_copies():
    mesh_dp = {"data": 32, "fsdp": 1, "tensor": 1}
    line = advice.mesh_advice(mesh_dp, 11 * GiB, GiB // 2, 95 * GiB)
    assert "\n" not in line and "mesh data=32 fsdp=1" in line and "22.50 GiB" in line
    assert "--set mesh.data=1 --set mesh.fsdp=-1" in line and "all 32 chips" in line
    assert advice.mesh_advice({"data": 1, "fsdp": 32, "tensor": 1}, 11 * GiB, 0) == ""
    # a base-sized model copied on every chip: under FAR_BYTES of copies, no line
    assert advice.mesh_advice({"data": 8, "fsdp": 1, "tensor": 1}, GiB, 0) == ""
    assert advice.mesh_advice({"data": 2, "fsdp": 4, "tensor": 1}, 3 * GiB, 0) != ""


def _xl_state_on_v5p_64(*sets):
    """T5 v1.1 XL's abstract train state on v5p-64's abstract devices, as the trainer builds
    it (no compile) -> (resolved mesh shape, the state)."""
    from t5lite import peft
    from t5lite.train import optim, trainer
    cfg = config_lib.load_config("t5_1_1_xl", list(sets))
    mesh = partitioning.make_mesh(cfg.mesh, tpu_topology.abstract_devices(
        tpu_topology.parse_topology(cfg.mesh.topology)))
    model = peft.build_model(cfg.model)
    abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh,
                                                  optim.optimizer_for(cfg, cfg.train.steps))
    return dict(mesh.shape), abstract


def test_advice_for_data_parallel_xl_on_v5p_64_and_none_for_the_preset():
    shipped_mesh, shipped = _xl_state_on_v5p_64()
    assert shipped_mesh == {"data": 1, "fsdp": 32, "tensor": 1}
    assert advice.train_state_advice(shipped_mesh, shipped) == ""
    dp_mesh, dp = _xl_state_on_v5p_64("mesh.data=32", "mesh.fsdp=1")
    line = advice.train_state_advice(dp_mesh, dp, tpu_topology.CHIPS["v5p"].hbm_bytes)
    # XL's 2.85B float32 parameters, their gradients and Adafactor's factored moments
    assert line.startswith("mesh data=32 fsdp=1 tensor=1 copies") and "\n" not in line
    assert 21 < float(line.split(" GiB per chip")[0].split()[-1]) < 22
    assert "all 32 chips (0.66 GiB per chip)" in line  # 1/32 of the copies


def test_compile_without_topology_reads_the_config_slice():
    from t5lite.cli import commands
    with pytest.raises(UserError, match="unknown TPU topology 'v3-8'"):  # read, not compiled
        commands.compile_command("gpt2_tiny", "", ["mesh.topology=v3-8"])
    with pytest.raises(UserError, match="states no TPU slice"):
        commands.compile_command("gpt2_tiny", "", ["mesh.topology="])


def test_compile_defaults_to_the_config_slice_and_prints_no_advice_for_it(capsys):
    # test_compile.py's small gpt2_tiny: one compile per process (tpu.compile caches it)
    sets = ["data.batch_size=8", "data.feature_lengths.targets=128", "model.vocab_size=256",
            "model.scan_unroll=1"]
    assert cli.main(["compile", "--config", "gpt2_tiny", "--json",
                     *[a for s in sets for a in ("--set", s)]]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["topology"] == "v5litepod-1" and r["mesh_advice"] == ""
