"""Mixture-of-experts layers (models/moe.py): Switch top-1 and GShard top-2 routing, capacity
and dropped tokens, the load-balancing loss and its path into the training loss, expert
weights sharded over the mesh's data axis, and parity with Hugging Face's Switch Transformers
sparse MLP."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5lite.config import ModelConfig
from t5lite.models import build_model, dummy_batch, moe
from t5lite.models import layers as L
from t5lite.mesh import partitioning
from t5lite.train import losses

KEY = functools.partial(jax.random.key, impl="rbg")


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0, max_length=32,
                ffn_layer="switch", num_experts=4, expert_capacity_factor=4.0)
    base.update(kw)
    return ModelConfig(**base)


def sparse_mlp(cfg, x_BLD, seed=0):
    layer = moe.SparseMLP(cfg)
    params = nn.meta.unbox(layer.init(KEY(seed), x_BLD)["params"])
    return layer, params


def test_switch_routes_each_token_to_one_expert_within_capacity():
    """All 12 tokens prefer expert 2; capacity 4: the first 4 (in sequence order) get it with
    their router probability as the weight, the other 8 get no expert at all."""
    logits_BLE = np.zeros((1, 12, 4), np.float32)
    logits_BLE[..., 2] = 3.0
    logits_BLE[0, ::3, 1] = 5.0  # tokens 0, 3, 6, 9 prefer expert 1 (4 of them: all fit)
    probs_BLE = jax.nn.softmax(jnp.asarray(logits_BLE))
    combine_BLEC, _ = moe.top1_routing(probs_BLE, capacity=4)
    per_token = np.asarray(combine_BLEC > 0).sum(axis=(2, 3))[0]
    assert set(per_token) <= {0, 1}
    to_2 = [t for t in range(12) if t % 3]
    np.testing.assert_array_equal(per_token[to_2], [1] * 4 + [0] * 4)
    np.testing.assert_array_equal(per_token[::3], 1)
    load_E = np.asarray(combine_BLEC > 0).sum(axis=(1, 3))[0]
    np.testing.assert_array_equal(load_E, [0, 4, 4, 0])
    slots = np.asarray(combine_BLEC[0, to_2[:4], 2] > 0).argmax(-1)
    np.testing.assert_array_equal(slots, [0, 1, 2, 3])  # one slot each, in order
    gate = np.asarray(combine_BLEC).sum(axis=(2, 3))[0]
    np.testing.assert_allclose(gate[to_2[:4]], np.asarray(probs_BLE)[0, to_2[:4], 2], rtol=1e-6)


def test_dropped_tokens_get_zero_ffn_output():
    """Through the layer: with every token sent to one expert, tokens past its capacity get
    exactly zero from the FFN (the residual alone carries them); the kept ones do not."""
    cfg = tiny(expert_capacity_factor=1.0)  # capacity max(16 * 1 / 4, 4) = 4
    x_BLD = jax.random.normal(KEY(1), (2, 16, 16))
    layer, params = sparse_mlp(cfg, x_BLD)
    params["router"]["kernel"] = jnp.zeros_like(params["router"]["kernel"]).at[:, 3].set(1.0)
    x_BLD = jnp.abs(x_BLD)  # positive inputs: expert 3 wins for every token
    y_BLD = np.asarray(layer.apply({"params": params}, x_BLD))
    assert np.all(np.abs(y_BLD[:, :4]).sum(-1) > 0)
    np.testing.assert_array_equal(y_BLD[:, 4:], 0.0)


def test_top2_combine_weights_sum_to_one():
    """GShard top-2 with room for everything: each token goes to two different experts whose
    weights are its two largest router probabilities renormalised to sum to 1."""
    probs_BLE = jax.nn.softmax(jax.random.normal(KEY(2), (3, 10, 5)) * 2)
    combine_BLEC, _ = moe.top2_routing(probs_BLE, capacity=10)
    c = np.asarray(combine_BLEC)
    np.testing.assert_allclose(c.sum(axis=(2, 3)), 1.0, atol=1e-6)
    experts_BLE = (c > 0).any(-1)
    np.testing.assert_array_equal(experts_BLE.sum(-1), 2)
    p = np.asarray(probs_BLE)
    top2 = np.sort(p, -1)[..., -2:]
    np.testing.assert_allclose(np.sort(c.sum(-1), -1)[..., -2:], top2 / top2.sum(-1, keepdims=True),
                               rtol=1e-5)


def test_top2_second_choices_queue_after_first_choices():
    """An expert's buffer takes every first choice before any second choice."""
    p = np.full((1, 6, 3), 0.05, np.float32)
    p[0, :3, 0], p[0, :3, 1] = 0.6, 0.35  # tokens 0-2: first expert 0, second expert 1
    p[0, 3:, 1], p[0, 3:, 2] = 0.6, 0.35  # tokens 3-5: first expert 1
    combine_BLEC, _ = moe.top2_routing(jnp.asarray(p), capacity=4)
    to_1 = np.asarray(combine_BLEC[0, :, 1] > 0)  # [L, C]
    np.testing.assert_array_equal(to_1[3:].argmax(-1), [0, 1, 2])  # first choices first
    np.testing.assert_array_equal(to_1[:3].any(-1), [True, False, False])  # one slot left


def test_load_balancing_loss_formula():
    """E^2 * mean_e(f_e * P_e) on a hand-made routing: 4 tokens over 2 experts, 3 choose
    expert 0: f = (3/4, 1/4), P = the mean probabilities."""
    p = jnp.asarray([[[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]]])
    _, loss = moe.top1_routing(p, capacity=4)
    f, P = np.array([0.75, 0.25]), np.array([0.65, 0.35])
    np.testing.assert_allclose(float(loss), 4 * np.mean(f * P), rtol=1e-6)
    _, loss2 = moe.top2_routing(p, capacity=4)  # top-2: f counts first choices only
    np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
    uniform = jnp.full((1, 8, 4), 0.25)
    np.testing.assert_allclose(float(moe.load_balancing_loss(
        uniform, jax.nn.one_hot(jnp.arange(8) % 4, 4)[None])), 1.0, rtol=1e-6)


def test_aux_loss_reaches_the_training_loss():
    """Every sparse layer sows weight * its loss; compute_loss adds their sum to the loss, and
    micro-batches (with the full batch's normalisers) add up to the full batch's value."""
    cfg = tiny(ffn_layer="moe", ffn_layer_every=2, moe_aux_loss_weight=0.5)
    model = build_model(cfg)
    batch = dummy_batch(cfg, 4, {"inputs": 8, "targets": 6})
    rng = np.random.default_rng(0)
    for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"):
        batch[k] = rng.integers(1, 64, batch[k].shape).astype(np.int32)
    params = nn.meta.unbox(jax.jit(model.init)(KEY(0), batch)["params"])
    run = jax.jit(lambda p, b: moe.apply_with_aux_loss(model, {"params": p}, b))
    outputs = run(params, batch)
    layers = [(s, i) for s in ("encoder", "decoder") for i in range(2)
              if "router" in params[s][f"layers_{i}"]["mlp"]]
    assert layers == [("encoder", 1), ("decoder", 1)]  # every 2nd layer
    _, sown = jax.jit(lambda p, b: model.apply({"params": p}, b, mutable=["aux_loss"]))(
        params, batch)
    per_layer = jax.tree.leaves(sown["aux_loss"])
    assert len(per_layer) == 2 and all(float(x) > 0 for x in per_layer)
    np.testing.assert_allclose(float(outputs["aux_loss"]), float(sum(per_layer)), rtol=1e-6)

    class Cfg:  # the training config's loss fields (compute_loss reads cfg.train / cfg.model)
        train = type("T", (), dict(loss_normalizing_factor=None, label_smoothing=0.0,
                                   z_loss=0.0, aux_lm_weight=0.0))
        model = cfg
    plain = {k: v for k, v in outputs.items() if k != "aux_loss"}
    loss, metrics = losses.compute_loss(Cfg, outputs, batch)
    base, _ = losses.compute_loss(Cfg, plain, batch)
    np.testing.assert_allclose(float(loss), float(base + outputs["aux_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["moe_aux_loss"]), float(outputs["aux_loss"]))
    norms = losses.normalizers(Cfg, batch)
    halves = [{k: v[i::2] for k, v in batch.items()} for i in range(2)]
    half_outputs = [run(params, h) for h in halves]
    parts = [losses.compute_loss(Cfg, o, h, norms)[1]["moe_aux_loss"]
             for o, h in zip(half_outputs, halves)]
    whole = np.mean([o["aux_loss"] for o in half_outputs])
    np.testing.assert_allclose(float(sum(parts)), whole, rtol=1e-6)


def test_expert_weights_sharded_over_data_axis():
    """8 host CPU devices, mesh data=4 x tensor=2: the experts' stacked kernels split their
    expert axis over "data" (2 experts per device) and run a jitted sharded forward pass."""
    cfg = tiny(num_experts=8, d_ff=32, ffn_layer="switch")
    mesh = partitioning.make_mesh(type("M", (), dict(data=4, fsdp=1, tensor=2))(),
                                  jax.devices()[:8])
    model = build_model(cfg)
    batch = dummy_batch(cfg, 4, {"inputs": 8, "targets": 6})
    abstract = jax.eval_shape(functools.partial(model.init, deterministic=True), KEY(0), batch)
    specs = nn.get_partition_spec(abstract)["params"]
    shardings = partitioning.logical_sharding(specs, mesh)
    wi = shardings["encoder"]["layers"]["mlp"]["wi"]
    assert tuple(wi.spec)[:2] == (None, "data")  # [layers, expert, embed, mlp]
    assert tuple(wi.spec)[3] == "tensor"
    with partitioning.activate(mesh):
        params = jax.jit(lambda k: nn.meta.unbox(model.init(k, batch)["params"]),
                         out_shardings=shardings)(KEY(0))
        logits = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"])(params, batch)
    shard = params["encoder"]["layers"]["mlp"]["wi"].addressable_shards[0].data
    assert shard.shape == (2, 2, 16, 16)  # 8 experts / 4, d_ff 32 / 2
    assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("capacity", [4, 16])
def test_parity_with_hf_switch_sparse_mlp(capacity):
    """transformers' SwitchTransformersSparseMLP and SparseMLP with the same weights give the
    same output, dropped tokens included (HF's expert_capacity = our capacity)."""
    torch = pytest.importorskip("torch")
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers import modeling_switch_transformers as hf
    e, d, f, length = 4, 16, 32, 16
    hf_cfg = SwitchTransformersConfig(d_model=d, d_ff=f, num_experts=e, expert_capacity=capacity,
                                      router_jitter_noise=0.0, dropout_rate=0.0,
                                      router_bias=False, dense_act_fn="relu")
    torch.manual_seed(0)
    theirs = hf.SwitchTransformersSparseMLP(hf_cfg).eval()
    with torch.no_grad():
        theirs.router.classifier.weight.mul_(30.0)  # confident, uneven routing
    x = torch.randn(2, length, d)
    with torch.no_grad():
        want = theirs(x).numpy()
    dropped = np.abs(want).sum(-1) == 0
    assert dropped.any() == (capacity < length)  # capacity 4 overflows, 16 never does
    cfg = tiny(d_model=d, d_ff=f, num_experts=e, expert_capacity_factor=capacity * e / length)
    assert moe.expert_capacity(length, e, cfg.expert_capacity_factor) == capacity
    experts = [theirs.experts[f"expert_{i}"] for i in range(e)]
    stack = lambda name: jnp.stack([jnp.asarray(  # noqa: E731
        getattr(m, name).weight.detach().numpy().T) for m in experts])
    params = {"router": {"kernel": jnp.asarray(theirs.router.classifier.weight.detach().numpy().T)},
              "wi": stack("wi"), "wo": stack("wo")}
    got = moe.SparseMLP(cfg).apply({"params": params}, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_train_step_adds_the_aux_loss_and_accumulates_it_exactly():
    """The jitted train step on a mesh: the Switch model's loss includes moe_aux_loss, and 2
    accumulated micro-batches give one big batch's loss, aux loss and gradient norm (routing
    groups are sequences, so the micro-batches route as the big batch does)."""
    from train_helpers import steps_per_accumulation, tiny_config

    from t5lite import config as config_lib
    cfg = tiny_config("encoder_decoder", batch_size=8)
    cfg.model.ffn_layer, cfg.model.num_experts, cfg.model.moe_aux_loss_weight = "switch", 4, 0.5
    cfg.mesh = config_lib.MeshConfig(data=4, fsdp=2)
    out = {k: metrics for k, (metrics, _) in steps_per_accumulation(cfg, (1, 2))[1].items()}
    assert out[1]["moe_aux_loss"] > 0
    np.testing.assert_allclose(out[1]["loss"], out[1]["cross_entropy"] + out[1]["z_loss"]
                               + out[1]["moe_aux_loss"], rtol=1e-5)
    for key in ("loss", "moe_aux_loss", "grad_norm"):
        np.testing.assert_allclose(out[2][key], out[1][key], rtol=2e-5, err_msg=key)


def _reference_losses(p, valid):
    """The reference's two load-balancing losses with padding (Mesh TF moe.py, numpy): top-2
    zeroes padding in both factors before averaging over the group; Switch averages both over
    the whole group and its [B, E] proxy times the [B, L] mask broadcasts to [B, L, E]."""
    e, first = p.shape[-1], np.eye(p.shape[-1])[p.argmax(-1)]
    top2 = np.mean((first * valid[..., None]).mean(1) * (p * valid[..., None]).mean(1)) * e * e
    switch = np.mean(p.mean(1)[:, None] * first.mean(1)[:, None] * valid[..., None]) * e * e
    return top2, switch


def test_padding_is_routed_nowhere_and_left_out_of_the_loss_as_the_reference():
    """Row 0: tokens 0-3 real, 4-7 padding; row 1: all real. Every token prefers expert 1,
    capacity 4: row 0's real tokens fill it and its padding takes no slot and gets nothing;
    a padding token before real ones (row 1 with token 0 padding) leaves slot 0 to them."""
    logits = np.zeros((2, 8, 3), np.float32)
    logits[..., 1] = 2.0
    logits[:, :, 0] = np.linspace(0, 1, 8)  # uneven probabilities: a loss that can differ
    p = jax.nn.softmax(jnp.asarray(logits))
    valid = np.ones((2, 8), bool)
    valid[0, 4:] = False
    valid[1, 0] = False
    for route in (lambda v: moe.top1_routing(p, 4, v),
                  lambda v: moe.top2_routing(p, 4, valid_BL=v)):
        combine, loss = route(jnp.asarray(valid))
        c = np.asarray(combine)
        np.testing.assert_array_equal(c[~valid], 0.0)  # padding: no expert, no slot
        slots = c[:, :, 1].argmax(-1)
        np.testing.assert_array_equal(slots[0, :4], [0, 1, 2, 3])
        np.testing.assert_array_equal(slots[1, 1:5], [0, 1, 2, 3])  # real tokens from slot 0
        assert not c[1, 5:, 1].any()  # full
    top2, switch = _reference_losses(np.asarray(p), valid.astype(np.float32))
    np.testing.assert_allclose(float(moe.top1_routing(p, 4, jnp.asarray(valid))[1]), switch,
                               rtol=1e-6)
    np.testing.assert_allclose(float(moe.top2_routing(p, 4, valid_BL=jnp.asarray(valid))[1]),
                               top2, rtol=1e-6)
    assert abs(top2 - switch) > 1e-3  # the two rules differ on this routing
    unmasked = float(moe.top1_routing(p, 4)[1])
    np.testing.assert_allclose(unmasked, _reference_losses(np.asarray(p), np.ones((2, 8)))[1],
                               rtol=1e-6)


# switch with --runslow only: the model hands valid tokens to either layer the same way, and
# test_padding_is_routed_nowhere_and_left_out_of_the_loss_as_the_reference checks top-1 routing
@pytest.mark.parametrize("ffn_layer", [pytest.param("switch", marks=pytest.mark.slow), "moe"])
def test_model_routes_only_real_tokens(ffn_layer):
    """Through the model (1-layer stacks, the expert FFN last): with room for every token,
    padding positions (encoder token 0, decoder segment 0) come out the same whatever the
    experts' weights, real positions do not."""
    cfg = tiny(ffn_layer=ffn_layer, num_encoder_layers=1, num_decoder_layers=1,
               expert_capacity_factor=4.0, num_experts=4)
    model = build_model(cfg)
    batch = dummy_batch(cfg, 2, {"inputs": 8, "targets": 6})
    rng = np.random.default_rng(1)
    tokens = rng.integers(2, 64, (2, 8)).astype(np.int32)
    tokens[0, 5:] = 0
    batch["encoder_input_tokens"] = tokens
    batch["decoder_input_tokens"] = rng.integers(2, 64, (2, 6)).astype(np.int32)
    batch["decoder_segment_ids"] = np.array([[1] * 6, [1] * 3 + [0] * 3], np.int32)
    params = nn.meta.unbox(jax.jit(model.init)(KEY(0), batch)["params"])

    @jax.jit
    def forward(p):
        enc = model.apply({"params": p}, batch["encoder_input_tokens"],
                          method=lambda m, t: m.encode(t))
        return enc, model.apply({"params": p}, batch)["logits"]

    def run(p):
        return tuple(np.asarray(a) for a in forward(p))

    def zero_experts(stack):
        mlp = params[stack]["layers"]["mlp"]
        return dict(params, **{stack: dict(params[stack], layers=dict(
            params[stack]["layers"], mlp=dict(mlp, wo=jnp.zeros_like(mlp["wo"]))))})

    enc, logits = run(params)
    enc_zero = run(zero_experts("encoder"))[0]
    np.testing.assert_allclose(enc_zero[0, 5:], enc[0, 5:], rtol=1e-6, atol=1e-6)
    assert np.abs(enc_zero[0, :5] - enc[0, :5]).max() > 1e-3
    logits_zero = run(zero_experts("decoder"))[1]
    np.testing.assert_allclose(logits_zero[1, 3:], logits[1, 3:], rtol=1e-5, atol=1e-5)
    assert np.abs(logits_zero[1, :3] - logits[1, :3]).max() > 1e-3


def test_ffn_init_scale_scales_expert_router_and_dense_ffn_kernels():
    """model.ffn_init_scale=0.1 (the reference gins' VarianceScalingInitializer.scale): the
    router, experts and dense FFN kernels get std sqrt(0.1 / fan_in) (1 / fan_in at 1.0);
    attention is the scale-1 layer's, key for key."""
    x_BLD = jnp.ones((1, 4, 64))
    for scale in (1.0, 0.1):
        cfg = tiny(num_experts=8, d_model=64, d_ff=128, head_dim=32, ffn_init_scale=scale)
        sparse = sparse_mlp(cfg, x_BLD)[1]
        dense = nn.meta.unbox(L.MLP(cfg).init(KEY(0), x_BLD)["params"])
        for kernel, fan_in in ((sparse["router"]["kernel"], 64), (sparse["wi"], 64),
                               (sparse["wo"], 128), (dense["wi"]["kernel"], 64),
                               (dense["wo"]["kernel"], 128)):
            np.testing.assert_allclose(np.std(kernel), np.sqrt(scale / fan_in), rtol=0.1)
        attention = nn.meta.unbox(L.MultiHeadAttention(cfg).init(
            KEY(0), x_BLD, x_BLD, 0.0)["params"])
        if scale == 1.0:
            base = attention
        for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(attention)):
            np.testing.assert_array_equal(a, b)


def test_decoder_layers_take_the_decoders_capacity_in_training_and_eval():
    """Every token to one expert, 16 tokens, 4 experts: an encoder layer keeps
    capacity_factor * 4 tokens in training and eval; a decoder layer 1.25 * 4 = 5 in training
    and 2.0 * 4 = 8 in eval (the paper's reference decoder)."""
    cfg = tiny(expert_capacity_factor=1.5, decoder_expert_capacity_factor=1.25,
               decoder_expert_capacity_factor_eval=2.0)
    x_BLD = jnp.abs(jax.random.normal(KEY(1), (1, 16, 16)))  # positive: expert 3 wins
    layer, params = sparse_mlp(cfg, x_BLD)
    params["router"]["kernel"] = jnp.zeros_like(params["router"]["kernel"]).at[:, 3].set(1.0)
    for decoder, deterministic, kept in ((False, False, 6), (False, True, 6), (True, False, 5),
                                         (True, True, 8)):
        y_BLD = layer.apply({"params": params}, x_BLD, deterministic, decoder=decoder,
                            rngs={"dropout": KEY(2)})
        assert int((np.abs(np.asarray(y_BLD)).sum(-1) > 0).sum()) == kept, (decoder, kept)
    assert moe.capacity_factor(tiny(), True, True) == tiny().expert_capacity_factor


def test_routing_groups_split_the_flattened_batch_as_mesh_tf():
    """The fewest equal groups of at most moe_group_size tokens (Mesh TF's _split_into_groups
    with one batch shard): the paper's encoder 128 x 512 -> 64 x 1024, decoder 128 x 114 ->
    16 x 912; 0 keeps one group a sequence."""
    assert moe.routing_groups(128 * 512, 1024, 512) == (64, 1024)
    assert moe.routing_groups(128 * 114, 1024, 114) == (16, 912)
    assert moe.routing_groups(100, 30, 10) == (4, 25)  # 3 groups do not divide 100
    assert moe.routing_groups(6, 1024, 1) == (1, 6)  # one decoding step: the batch's tokens
    assert moe.routing_groups(128 * 114, 0, 114) == (128, 114)


def test_a_routing_group_shares_one_capacity_across_sequences():
    """Every token to expert 3, capacity factor 1 of 4 experts: one sequence a group keeps the
    first 4 tokens of each of the 2 sequences; groups of 16 tokens keep the first 4 of the
    flattened batch (all in sequence 0), each with the same output as per sequence."""
    x_BLD = jnp.abs(jax.random.normal(KEY(1), (2, 8, 16)))
    outs = {}
    for group in (0, 16):
        cfg = tiny(expert_capacity_factor=1.0, moe_group_size=group)
        layer, params = sparse_mlp(cfg, x_BLD)
        params["router"]["kernel"] = jnp.zeros_like(params["router"]["kernel"]).at[:, 3].set(1.)
        outs[group] = np.asarray(layer.apply({"params": params}, x_BLD, True))
    kept = {g: np.abs(y).sum(-1) > 0 for g, y in outs.items()}
    np.testing.assert_array_equal(kept[0], [[1] * 4 + [0] * 4] * 2)
    np.testing.assert_array_equal(kept[16], [[1] * 4 + [0] * 4, [0] * 8])
    np.testing.assert_allclose(outs[16][0, :4], outs[0][0, :4], rtol=1e-6)
