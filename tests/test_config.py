"""Config loading and overrides: unknown keys with suggestions, bad values, bad meshes, and the
training configs built on the model configs."""

import json

import pytest

from t5lite.cli import main as cli
from t5lite.mesh import partitioning
from t5lite import config as config_lib
from t5lite.errors import UserError


@pytest.mark.parametrize("name, arch, task", [
    ("quickstart", "encoder_decoder", "corpus_span_corruption"),
    ("tiny_bert_mlm", "encoder_only", "corpus_mlm"),
    ("tiny_gpt_lm", "decoder_only", "corpus_lm"),
])
def test_training_configs_load_on_top_of_the_model_configs(name, arch, task):
    cfg = config_lib.load_config(f"configs/{name}.py")
    assert (cfg.model.architecture, cfg.data.mixture_or_task) == (arch, task)
    assert cfg.model.vocab_size == 8192 and cfg.train.prepare_data
    assert cfg.checkpoint.every_steps > 0 and cfg.train.eval_every > 0
    over = config_lib.load_config(name, ["train.steps=7", "optim.learning_rate=0.5",
                                         "mesh.fsdp=2", "data.feature_lengths={'inputs': 64, "
                                         "'targets': 16}"])
    assert (over.train.steps, over.optim.learning_rate, over.mesh.fsdp) == (7, 0.5, 2)
    assert over.data.feature_lengths == {"inputs": 64, "targets": 16}


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(UserError, match=r"unknown config key 'optim.learnig_rate'.*"
                                        r"Did you mean: optim.learning_rate"):
        config_lib.load_config("quickstart", ["optim.learnig_rate=1e-3"])
    with pytest.raises(UserError, match="Did you mean: train.steps"):
        config_lib.load_config("quickstart", ["train.step=3"])


def test_a_misspelt_field_in_a_config_file_fails_at_its_line(tmp_path):
    """Assigning a field that does not exist (a typo) in get_config() is an error, not a new
    attribute nobody reads; it names the file and line and suggests the field."""
    file = tmp_path / "typo.py"
    file.write_text("from t5lite.config import Config\n\n\ndef get_config():\n"
                    "    cfg = Config()\n    cfg.train.stpes = 20\n    return cfg\n")
    with pytest.raises(UserError, match=r"typo.py:6: unknown config key 'train.stpes'. "
                                        r"Did you mean: train.steps"):
        config_lib.load_config(str(file))
    file.write_text(file.read_text().replace("cfg.train.stpes = 20",
                                             "cfg.model.peft.lora_rnak = 4"))
    with pytest.raises(UserError, match="Did you mean: model.peft.lora_rank"):
        config_lib.load_config(str(file))
    with pytest.raises(UserError, match="unknown config key 'trian'. Did you mean: train"):
        config_lib.Config().trian = None
    # reading a misspelt section, or a misspelt keyword of a section's constructor
    for line, key, meant in [("cfg.trian.steps = 20", "'trian'", "train"),
                             ("cfg.train = TrainConfig(stpes=20)", "'train.stpes'",
                              "train.steps")]:
        file.write_text("from t5lite.config import Config, TrainConfig\n\n\n"
                        f"def get_config():\n    cfg = Config()\n    {line}\n    return cfg\n")
        with pytest.raises(UserError, match=f"typo.py:6: unknown config key {key}. Did you "
                                            f"mean: {meant}"):
            config_lib.load_config(str(file))
    assert not hasattr(config_lib.Config().train, "stpes")  # still an AttributeError


def test_a_loaded_config_is_frozen_and_replace_derives_a_changed_copy():
    cfg = config_lib.load_config("quickstart")
    with pytest.raises(UserError, match=r"cannot set train.steps: the config is frozen after "
                                        r"validation. Pass overrides to load_config\(name, "
                                        r"\[\"train.steps=...\"\]\) or .*replace\(cfg"):
        cfg.train.steps = 20
    with pytest.raises(UserError, match="cannot set model.peft.lora_rank: the config is frozen"):
        cfg.model.peft.lora_rank = 4
    new = config_lib.replace(cfg, {"train.steps": 20, "model.peft.lora_rank": "4"})
    assert (new.train.steps, new.model.peft.lora_rank, cfg.train.steps) == (20, 4, 300)
    assert config_lib.replace(cfg, ["train.steps=20"]).train.steps == 20
    with pytest.raises(UserError, match="frozen"):
        new.train.steps = 1
    with pytest.raises(UserError, match="train.steps=-1 is out of range"):
        config_lib.replace(cfg, {"train.steps": -1})
    with pytest.raises(UserError, match="Did you mean: train.steps"):
        config_lib.replace(cfg, {"train.stpes": 1})
    editable = config_lib.load_editable("quickstart")  # what config files build on
    editable.train.steps = 20
    assert editable.train.steps == 20 and cfg.train.steps == 300


def test_bad_values_are_user_errors():
    with pytest.raises(UserError, match="train.steps must be an integer"):
        config_lib.load_config("quickstart", ["train.steps=many"])
    with pytest.raises(UserError, match="optim.learning_rate must be a number"):
        config_lib.load_config("quickstart", ["optim.learning_rate=fast"])
    with pytest.raises(UserError, match="optim.name='adamx' is not one of .* Did you mean 'adamw'"):
        config_lib.load_config("quickstart", ["optim.name=adamx"])
    with pytest.raises(UserError, match="must look like section.field=value"):
        config_lib.load_config("quickstart", ["train.steps"])
    with pytest.raises(UserError, match="divisible by train.grad_accum_steps"):
        config_lib.load_config("quickstart", ["train.grad_accum_steps=3"])
    with pytest.raises(UserError, match="mlm_predict_fraction=0.25: .* architecture='encoder_o"):
        config_lib.load_config("quickstart", ["model.mlm_predict_fraction=0.25"])
    with pytest.raises(UserError, match="mlm_predict_fraction=1.5: use 0"):
        config_lib.load_config("bert_tiny", ["model.mlm_predict_fraction=1.5"])
    assert config_lib.load_config("bert_tiny", ["model.mlm_predict_fraction=0"])


def test_mesh_that_does_not_divide_devices_or_batch_is_a_user_error():
    cfg = config_lib.load_config("quickstart", ["mesh.data=3"])
    with pytest.raises(UserError, match="uses 3 devices but 8 are available"):
        partitioning.make_mesh(cfg.mesh)
    cfg = config_lib.load_config("quickstart", ["mesh.data=-1", "mesh.fsdp=8",
                                                "data.batch_size=12"])
    mesh = partitioning.make_mesh(cfg.mesh)
    with pytest.raises(UserError, match="data.batch_size to a multiple of 8"):
        partitioning.check_batch(mesh, cfg.data.batch_size)


def test_cli_reports_user_errors_with_exit_code_2(capsys, tmp_path):
    rc = cli.main(["train", "--config", "configs/quickstart.py", "--workdir", str(tmp_path),
                   "--set", "train.stpes=3"])
    assert rc == 2
    assert "Did you mean: train.steps" in capsys.readouterr().err
    rc = cli.main(["train", "--config", "configs/quickstrat.py", "--workdir", str(tmp_path)])
    assert rc == 2
    assert "Did you mean: quickstart" in capsys.readouterr().err


def test_model_vocab_smaller_than_the_task_vocabulary_is_a_user_error(tmp_path, monkeypatch):
    import tasks_testdata
    from t5lite.train import trainer
    monkeypatch.setenv("T5LITE_DATA_DIR", tasks_testdata.make_data_dir(str(tmp_path / "d")))
    cfg = config_lib.load_config("quickstart", ["model.vocab_size=512", "train.prepare_data=()"])
    with pytest.raises(UserError, match=r"model.vocab_size=512 is smaller than the 700 ids .*"
                                        r"Set model.vocab_size >= 700"):
        trainer.prepare_tasks(cfg)
    cfg = config_lib.replace(cfg, {"model.vocab_size": 768})
    trainer.prepare_tasks(cfg)


def test_cli_imports_tensorflow_without_its_load_time_log_lines(tmp_path):
    """TF logs oneDNN / CUDA-stub lines through absl at import; the CLI keeps them off stderr
    (unless TF_CPP_MIN_LOG_LEVEL=0) and still runs the command."""
    import os
    import subprocess
    import sys

    import tasks_testdata
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["T5LITE_DATA_DIR"] = tasks_testdata.make_data_dir(str(tmp_path / "d"))
    code = "from t5lite.cli import main as cli; cli.main(['tasks', 'list'])"
    proc = subprocess.run([sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "corpus_span_corruption" in proc.stdout
    assert "oneDNN custom operations" not in proc.stderr
    assert "cudart_stub" not in proc.stderr


def test_configs_saved_before_a_field_keep_the_value_they_trained_with():
    """config.json written before model.flat_kernels existed trained with [D, H, K] kernels:
    reloading it (resume, load_params) must build that layout, and resuming it under a
    config that says otherwise is a named difference, not a shape error at restore."""
    from t5lite.store import workdir
    new = json.loads(json.dumps(config_lib.to_dict(config_lib.load_config("t5_1_1_tiny"))))
    assert new["model"]["flat_kernels"] is True
    old = json.loads(json.dumps(new))
    del old["model"]["flat_kernels"]
    assert config_lib.from_dict(old).model.flat_kernels is False
    assert config_lib.from_dict(new).model.flat_kernels is True
    assert workdir.config_diff(old, new) == {"model.flat_kernels": (False, True)}
    legacy = json.loads(json.dumps(new))
    legacy["model"]["flat_kernels"] = False
    assert workdir.config_diff(old, legacy) == {}


def test_a_feature_length_beyond_the_learned_position_table_is_refused_before_training():
    """A sequence longer than model.max_length would read past the learned position table (NaN
    at step 1); the config check names both numbers and the fix."""
    with pytest.raises(UserError, match=r"gives the decoder 512 tokens \(its feature length\) "
                                        r"but model.position='learned' has only "
                                        r"model.max_length=256 positions: lower"):
        config_lib.load_config("tiny_gpt_lm", ["data.feature_lengths={'targets': 512}"])
    with pytest.raises(UserError, match=r"decoder 258 tokens \(inputs \+ targets, packed"):
        config_lib.load_config("tiny_gpt_sentiment",
                               ["data.feature_lengths={'inputs': 250, 'targets': 8}"])
    with pytest.raises(UserError, match="gives the encoder 129 tokens"):
        config_lib.load_config("tiny_bert_mlm", ["data.feature_lengths.inputs=129"])
    cfg = config_lib.load_config("tiny_gpt_lm", ["data.feature_lengths={'targets': 256}"])
    with pytest.raises(UserError, match="max_length=256 positions"):
        config_lib.replace(cfg, {"data.feature_lengths": {"targets": 300}})
    # relative positions have no table: any length goes
    config_lib.load_config("quickstart", ["data.feature_lengths={'inputs': 4096, 'targets': 8}"])


def test_a_config_error_shows_before_tensorflow_is_imported(tmp_path):
    """`t5lite train` checks the config before it imports TensorFlow (seconds): a typo is
    reported at once, and nothing is written to the workdir."""
    import subprocess
    import sys
    code = ("import sys; from t5lite.cli import main as cli; "
            "rc = cli.main(['train', '--config', 'tiny_gpt_lm', '--workdir', sys.argv[1], "
            "'--set', 'train.stpes=3']); "
            "print(rc, 'tensorflow' in sys.modules, 'seqio' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False", "False"], proc.stderr[-2000:]
    assert "Did you mean: train.steps" in proc.stderr
    assert not (tmp_path / "run").exists()
