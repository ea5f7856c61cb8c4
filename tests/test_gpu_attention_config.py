"""model.attention_kernel's GPU choices through the config (models/gpu_attention.py, registered in
models/plan.py): every choice has its registry entry; "auto" is "xla" on this CPU host (the
same traced program) and, on a simulated GPU backend (gpu_attention.default_backend), runs the
kernel it picks, whose logits and gradients equal the XLA attention's; with attention dropout
in training it stays "xla" there; "cudnn" / "flash_gpu" named on a CPU are refused in one
line; a training run logs auto's pick once. The per-layer and whole-T5 comparisons of the
named kernels are in tests/test_gpu_attention.py.

On this host cuDNN's wrapper runs through XLA's implementation of the same call
(CUDNN_IMPLEMENTATION="xla") and the Triton kernels in Pallas interpret mode
(INTERPRET_OFF_GPU), both set per test.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.config import ModelConfig, presets
from t5lite.errors import UserError
from t5lite.models import build_model
from t5lite.models import gpu_attention as GA
from t5lite.models.plan import ATTENTION_BACKENDS
from t5lite.train import trainer
from numerics import assert_close_at_scale, assert_trees_close_at_scale
from test_gpu_attention import T5, _model_grads
from test_gpu_attention import _small_packed_batch as _t5_batch
from train_helpers import tf_iterator, tiny_config

CHOICES = {f.name: f for f in dataclasses.fields(ModelConfig)}["attention_kernel"].metadata[
    "choices"]


def _gpt(**fields):
    """GPT-2's family (causal, learned positions, scaled logits) at test size."""
    return dataclasses.replace(presets.gpt2("tiny").model, **{
        **dict(vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64,
               num_decoder_layers=2, dropout_rate=0.0, max_length=64), **fields})


def _gpt_batch():
    tokens = np.random.default_rng(0).integers(1, 64, (2, 40)).astype(np.int32)
    return {k: jnp.asarray(v) for k, v in dict(
        decoder_input_tokens=tokens, decoder_target_tokens=np.roll(tokens, -1, 1),
        decoder_loss_weights=np.ones((2, 40), np.float32)).items()}


# T5 at test size, one layer a stack (relative bias in both, cross-attention)
T5_SMALL = dataclasses.replace(T5, num_encoder_layers=1, num_decoder_layers=1)


@pytest.fixture
def on_gpu(monkeypatch):
    """This process seen as a GPU backend by the kernels' choice; the Triton kernels
    interpreted, 16-slot blocks (every attention spans several blocks)."""
    monkeypatch.setattr(GA, "default_backend", lambda: "gpu")
    monkeypatch.setattr(GA, "INTERPRET_OFF_GPU", True)
    monkeypatch.setattr(GA, "GPU_BLOCK", 16)


def _count_attends(monkeypatch, cls):
    """A list that grows each time ``cls.attend`` (a bias object's kernel) is traced."""
    calls, attend = [], cls.attend
    monkeypatch.setattr(cls, "attend", lambda self, *a: calls.append(1) or attend(self, *a))
    return calls


def _program(cfg, batch, deterministic):
    """The traced program of apply (text) of cfg's model on ``batch``."""
    model = build_model(cfg)
    variables = jax.eval_shape(model.init, jax.random.key(0), batch)
    return str(jax.make_jaxpr(lambda v: model.apply(
        v, batch, deterministic=deterministic, rngs={"dropout": jax.random.key(1)}))(variables))


def _assert_agree(cfg, kernel, batch):
    """Loss, logits and every parameter's gradient with ``kernel`` equal xla's (float32
    rounding, at each tree's scale)."""
    (loss_x, logits_x, grads_x), (loss_k, logits_k, grads_k) = (
        _model_grads(dataclasses.replace(cfg, attention_kernel=k), batch) for k in ("xla", kernel))
    assert_close_at_scale(loss_k, loss_x)
    assert_close_at_scale(logits_k, logits_x)
    assert_trees_close_at_scale(grads_k, grads_x)


def test_every_choice_has_its_registry_entry():
    """The config's choices are the registry's names; only auto stands for another entry."""
    assert set(CHOICES) == set(ATTENTION_BACKENDS)
    for name, entry in ATTENTION_BACKENDS.items():
        assert entry.name == name and (entry.choose is not None) == (name == "auto")


@pytest.mark.parametrize("family", ["t5", "gpt"])
def test_auto_on_cpu_is_the_xla_program(family):
    """On a CPU "auto" is "xla": the same traced program, in training and in evaluation."""
    cfg, batch = (T5_SMALL, _t5_batch()) if family == "t5" else (_gpt(), _gpt_batch())
    for deterministic in (False, True):
        auto, xla = (_program(dataclasses.replace(cfg, attention_kernel=k), batch,
                              deterministic) for k in ("auto", "xla"))
        assert auto == xla


# (T5: slow here; fast, the same guard: test_config_reaches_model's auto traces cuDNN's program
# on a GPU, and test_gpu_attention's T5 with cuDNN's wrapper equals xla)
@pytest.mark.parametrize("family", ["gpt", pytest.param("t5", marks=pytest.mark.slow)])
def test_auto_on_a_gpu_picks_cudnn_and_equals_xla(on_gpu, monkeypatch, family):
    """GPT, and a tiny T5 (packed rows, relative bias, cross-attention), with "auto" on a
    GPU: cuDNN's wrapper runs the attention and the model equals xla's."""
    monkeypatch.setattr(GA, "CUDNN_IMPLEMENTATION", "xla")
    cfg, batch = (T5_SMALL, _t5_batch()) if family == "t5" else (_gpt(), _gpt_batch())
    assert GA.resolve(dataclasses.replace(cfg, attention_kernel="auto")) == "cudnn"
    calls = _count_attends(monkeypatch, GA.CudnnBias)
    _assert_agree(cfg, "auto", batch)
    assert calls, "auto on a GPU did not attend through cuDNN's wrapper"


def test_auto_on_a_gpu_picks_flash_gpu_for_float32_and_equals_xla(on_gpu, monkeypatch):
    """GPT with "auto" on a GPU in float32 compute (which cuDNN lacks): the Triton kernel
    runs the attention and the model equals xla's."""
    assert GA.resolve(_gpt(attention_kernel="auto")) == "flash_gpu"
    calls = _count_attends(monkeypatch, GA.FlashGpuBias)
    _assert_agree(_gpt(), "auto", _gpt_batch())
    assert calls, "auto on a GPU in float32 did not attend through the Triton kernel"


def test_gpt_with_flash_gpu_equals_xla(on_gpu):
    """GPT named "flash_gpu" (causal, no position bias in the kernel): xla's model."""
    _assert_agree(_gpt(), "flash_gpu", _gpt_batch())


def test_auto_with_attention_dropout_trains_with_xla(on_gpu, monkeypatch):
    """No kernel has attention dropout: on a GPU "auto" trains with xla's program (dropout
    included) and evaluates with cuDNN's, where model.dropout_rate > 0."""
    monkeypatch.setattr(GA, "CUDNN_IMPLEMENTATION", "xla")
    cfg, batch = _gpt(dropout_rate=0.1), _gpt_batch()

    def program(kernel, deterministic):
        return _program(dataclasses.replace(cfg, attention_kernel=kernel), batch, deterministic)

    assert program("auto", False) == program("xla", False)
    assert program("auto", True) == program("cudnn", True) != program("xla", True)
    line = GA.describe(dataclasses.replace(cfg, attention_kernel="auto"))
    assert line.startswith("model.attention_kernel=auto on gpu: xla in training, cudnn in "
                           "evaluation") and "dropout_rate=0" in line


@pytest.mark.parametrize("kernel", ["cudnn", "flash_gpu"])
def test_named_gpu_kernel_on_cpu_is_refused_in_one_line(kernel):
    """Building and running the model with a GPU kernel on a CPU: a UserError saying to use
    xla or auto (nothing runs interpreted behind the user's back)."""
    model = build_model(dataclasses.replace(T5_SMALL, attention_kernel=kernel))
    with pytest.raises(UserError, match=f"attention_kernel='{kernel}'.*backend is cpu") as info:
        jax.eval_shape(model.init, jax.random.key(0), _t5_batch())
    assert "\n" not in str(info.value) and "model.attention_kernel='xla'" in str(info.value)


def test_flash_off_a_tpu_is_said_once_as_interpreted():
    """The TPU kernel named on a CPU or GPU runs in Pallas interpret mode (tests use that): the
    line a run logs says so and names the fix; on a TPU, and for xla, nothing is said."""
    flash = dataclasses.replace(T5_SMALL, attention_kernel="flash")
    for backend in ("cpu", "gpu"):
        line = GA.describe(flash, backend)
        assert line.startswith(f"model.attention_kernel=flash on {backend}: ") and (
            "interpret mode" in line and "model.attention_kernel=xla or auto" in line), line
    assert GA.describe(flash, "tpu") == ""
    assert GA.describe(dataclasses.replace(T5_SMALL, attention_kernel="xla"), "cpu") == ""


def test_other_token_mixers_take_auto_and_refuse_the_kernels():
    """A token mixer that reads the masks as arrays: "auto" is accepted (it is xla there),
    a named kernel is refused by the config, in one line."""
    conv = dict(attention_type="lightweight_conv")
    build_model(dataclasses.replace(T5, attention_kernel="auto", **conv))
    with pytest.raises(UserError, match="attention_kernel=xla .or auto.") as info:
        build_model(dataclasses.replace(T5, attention_kernel="flash_gpu", **conv))
    assert "\n" not in str(info.value)


def test_flash_gpu_refuses_head_dims_triton_cannot_lower():
    """Why flash_gpu needs head_dim a power of two: Triton's lowering refuses any other
    [block, head_dim] array (checked by lowering for CUDA here)."""
    seg = jnp.ones((1, 64), jnp.int32)
    x = jax.ShapeDtypeStruct((1, 64, 1, 48), jnp.bfloat16)
    fn = jax.jit(lambda q, k, v: GA.FlashGpuBias(seg, seg).attend(q, k, v))
    with pytest.raises(ValueError, match="power of 2"):
        fn.trace(x, x, x).lower(lowering_platforms=("cuda",))
    cfg = dataclasses.replace(T5, head_dim=48, attention_kernel="flash_gpu")
    assert "power of two" in GA.covers(cfg, "flash_gpu", backend="gpu")


def test_a_training_run_logs_autos_pick_once(tmp_path, capsys):
    """`t5lite train` with "auto" says what it runs (here: xla, on a CPU) once."""
    cfg = tiny_config()
    cfg.model.attention_kernel = "auto"
    cfg.train.steps, cfg.train.eval_steps = 1, 0
    trainer.train(cfg, str(tmp_path), train_iter=tf_iterator(cfg))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "attention_kernel" in ln]
    assert lines == ["model.attention_kernel=auto on cpu: xla"]
