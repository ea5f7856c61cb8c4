"""Mixture-of-experts FFN layers: GShard top-2 ("moe") and Switch top-1 ("switch") routing.

Shapes: B batch, L length, D embed, E experts, C expert capacity, F expert hidden width; the
routing functions take [B, L] as (routing groups, tokens a group). As in Mesh TensorFlow's
MoE1D (the codebase of Narang et al. 2021): the batch's tokens, flattened, are split into the
fewest equal groups of at most model.moe_group_size tokens (its moe_group_size, 1024 in the
paper's gins; 0 here = each sequence a group, as Hugging Face's Switch routes); the router
runs in float32; every expert takes at most C = capacity_factor * group / E tokens of a group
(at least 4), in token order; a token routed past a full expert gets nothing from it, so its
FFN output is zero and only the residual carries it. The
load-balancing loss E^2 * mean_e(fraction of tokens whose first choice is e * mean router
probability of e) is sown into the "aux_loss" collection times model.moe_aux_loss_weight;
``sown_aux_loss`` adds it up for the training loss. Expert weights carry the logical axis
"expert" (partitioning.py maps it onto a mesh axis), so each device holds its own experts and
the dispatched tokens [E, B, C, D] move to them (an all-to-all under GSPMD).

Padding (``valid_BL`` false: segment id 0, or token 0 in an unpacked encoder) is routed
nowhere, as the reference's ``importance`` (its nonpadding) does: it takes no capacity and its
FFN output is zero. The reference's two gatings leave it out of the loss differently, and
this follows each: top-2 counts only real tokens in both factors (still divided by L);
Switch averages both factors over all L tokens and scales the group's term by its fraction of
real tokens (the reference multiplies the [B, E] proxy by the [B, L] mask and averages).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models.registry import FFNLayer

MIN_CAPACITY = 4  # Mesh TensorFlow's min_expert_capacity
SECOND_THRESHOLD = 0.2  # GShard's "random" second-expert policy (training only)
AUX_COLLECTION = "aux_loss"


def expert_capacity(length: int, num_experts: int, capacity_factor: float) -> int:
    """Tokens one expert takes from a routing group of ``length`` tokens."""
    return min(length, max(int(length * capacity_factor / num_experts), MIN_CAPACITY))


def routing_groups(tokens: int, max_group: int, length: int) -> tuple[int, int]:
    """(groups, tokens a group) for a batch of ``tokens`` tokens in sequences of ``length``:
    Mesh TF's _split_into_groups (the fewest groups of at most ``max_group`` tokens that divide
    the batch evenly; its mesh factor is 1 here, which leaves the paper's shapes as they were:
    128 x 512 -> 64 x 1024, 128 x 114 -> 16 x 912); ``max_group`` 0: one group a sequence."""
    if not max_group:
        return tokens // length, length
    groups = max(1, tokens // max_group)
    while tokens % groups:
        groups += 1
    return groups, tokens // groups


def capacity_factor(cfg, decoder: bool, deterministic: bool) -> float:
    """The capacity factor of an encoder / decoder layer in training / eval: the decoder's
    own fields when set (model.decoder_expert_capacity_factor[_eval]; 0 = the model's)."""
    if not decoder:
        return cfg.expert_capacity_factor
    own = (cfg.decoder_expert_capacity_factor_eval if deterministic
           else cfg.decoder_expert_capacity_factor)
    return own or cfg.expert_capacity_factor


def load_balancing_loss(probs_BLE, first_BLE, group_weight_B=None):
    """E^2 * mean over groups and experts of (fraction of the group's tokens whose first
    choice is the expert) * (mean router probability of the expert): 1 when balanced. Each
    group's term times ``group_weight_B`` when given."""
    e = probs_BLE.shape[-1]
    density_BE = jnp.mean(first_BLE, axis=1)
    proxy_BE = jnp.mean(probs_BLE, axis=1)
    per_group_B = jnp.mean(density_BE * proxy_BE, axis=-1)
    if group_weight_B is not None:
        per_group_B = per_group_B * group_weight_B
    return jnp.mean(per_group_B) * float(e * e)


def _positions(mask_BLE, offset_BE=None):
    """Each routed token's slot in its expert's buffer: the tokens before it in the sequence
    routed to that expert (plus ``offset``), [B, L] (0 where not routed)."""
    before_BLE = jnp.cumsum(mask_BLE, axis=1) - mask_BLE
    if offset_BE is not None:
        before_BLE = before_BLE + offset_BE[:, None, :]
    return jnp.sum(before_BLE * mask_BLE, axis=-1)


def _combine(gate_BL, index_BL, slot_BL, kept_BL, num_experts, capacity):
    """[B, L, E, C]: gate at (expert, slot) for each kept token, 0 elsewhere."""
    slot_BLC = jax.nn.one_hot(slot_BL.astype(jnp.int32), capacity)
    expert_BLE = jax.nn.one_hot(index_BL, num_experts)
    return (gate_BL * kept_BL)[..., None, None] * expert_BLE[..., None] * slot_BLC[:, :, None]


def top1_routing(probs_BLE, capacity: int, valid_BL=None):
    """Switch routing: each token (of ``valid_BL``, when given) to its most probable expert,
    weighted by that probability, while the expert has room. -> (combine [B, L, E, C],
    load-balancing loss)."""
    e = probs_BLE.shape[-1]
    index_BL = jnp.argmax(probs_BLE, axis=-1)
    gate_BL = jnp.max(probs_BLE, axis=-1)
    mask_BLE = jax.nn.one_hot(index_BL, e)
    if valid_BL is None:
        loss = load_balancing_loss(probs_BLE, mask_BLE)
    else:
        real_BL = valid_BL.astype(probs_BLE.dtype)
        loss = load_balancing_loss(probs_BLE, mask_BLE, jnp.mean(real_BL, axis=1))
        mask_BLE = mask_BLE * real_BL[..., None]
    slot_BL = _positions(mask_BLE)
    kept_BL = jnp.sum(mask_BLE, axis=-1) * (slot_BL < capacity)
    return _combine(gate_BL, index_BL, slot_BL, kept_BL, e, capacity), loss


def top2_routing(probs_BLE, capacity: int, uniform_BL=None, valid_BL=None):
    """GShard routing: each token (of ``valid_BL``, when given) to its two most probable
    experts with gates renormalised to sum to 1. The second choice is kept with probability
    min(1, gate_2 / 0.2) when ``uniform_BL`` (U[0, 1) draws, training) is given, else always.
    First choices fill the buffers before second choices. -> (combine [B, L, E, C],
    load-balancing loss)."""
    e = probs_BLE.shape[-1]
    index1_BL = jnp.argmax(probs_BLE, axis=-1)
    mask1_BLE = jax.nn.one_hot(index1_BL, e)
    real_BL = jnp.ones(probs_BLE.shape[:2], probs_BLE.dtype) if valid_BL is None else (
        valid_BL.astype(probs_BLE.dtype))
    gate1_BL = jnp.max(probs_BLE, axis=-1)
    rest_BLE = probs_BLE * (1.0 - mask1_BLE)
    index2_BL = jnp.argmax(rest_BLE, axis=-1)
    mask2_BLE = jax.nn.one_hot(index2_BL, e)
    gate2_BL = jnp.max(rest_BLE, axis=-1)
    denom_BL = gate1_BL + gate2_BL + 1e-9
    gate1_BL, gate2_BL = gate1_BL / denom_BL, gate2_BL / denom_BL
    mask1_BLE, mask2_BLE = mask1_BLE * real_BL[..., None], mask2_BLE * real_BL[..., None]
    loss = load_balancing_loss(probs_BLE * real_BL[..., None], mask1_BLE)
    if uniform_BL is not None:
        mask2_BLE = mask2_BLE * (uniform_BL < gate2_BL / SECOND_THRESHOLD)[..., None]
    slot1_BL = _positions(mask1_BLE)
    kept1_BL = jnp.sum(mask1_BLE, axis=-1) * (slot1_BL < capacity)
    first_count_BE = jnp.sum(mask1_BLE * kept1_BL[..., None], axis=1)
    slot2_BL = _positions(mask2_BLE, first_count_BE)
    kept2_BL = jnp.sum(mask2_BLE, axis=-1) * (slot2_BL < capacity)
    combine = (_combine(gate1_BL, index1_BL, slot1_BL, kept1_BL, e, capacity)
               + _combine(gate2_BL, index2_BL, slot2_BL, kept2_BL, e, capacity))
    return combine, loss


class SparseMLP(nn.Module):
    """The FFN of a mixture-of-experts layer (cfg.ffn_layer "moe": top-2, "switch": top-1).

    Params: router/kernel [D, E] ("embed", "expert"); wi (or wi_0, wi_1 for gated
    activations) [E, D, F] ("expert", "embed", "mlp"); wo [E, F, D] ("expert", "mlp", "embed"),
    all fan-in initialised times model.ffn_init_scale (the reference's gins: 0.1).
    ``valid_BL``: the real (non-padding) tokens, the only ones routed (all when None);
    ``decoder``: the layer is a decoder's (its capacity factor: ``capacity_factor``).
    """

    cfg: object

    @nn.compact
    def __call__(self, x_BLD, deterministic=True, valid_BL=None, decoder=False):
        cfg = self.cfg
        b, l, d = x_BLD.shape
        g, s = routing_groups(b * l, cfg.moe_group_size, l)
        out_GSD = self._route(x_BLD.reshape(g, s, d), deterministic,
                              None if valid_BL is None else valid_BL.reshape(g, s), decoder)
        return L.constrain(out_GSD.reshape(b, l, d), ("batch", "length", "embed"))

    def _route(self, x_BLD, deterministic, valid_BL, decoder):
        """The layer on routing groups: x [B groups, L tokens a group, D] -> [B, L, D]."""
        cfg = self.cfg
        dtype = L.compute_dtype(cfg)
        e, f, d = cfg.num_experts, cfg.expert_d_ff or cfg.d_ff, x_BLD.shape[-1]
        capacity = expert_capacity(x_BLD.shape[1], e,
                                   capacity_factor(cfg, decoder, deterministic))
        gate_x_BLD = x_BLD.astype(jnp.float32)
        if cfg.router_jitter > 0 and not deterministic:
            gate_x_BLD = gate_x_BLD * jax.random.uniform(
                self.make_rng("dropout"), gate_x_BLD.shape, jnp.float32,
                1.0 - cfg.router_jitter, 1.0 + cfg.router_jitter)
        router = L.DenseGeneral((e,), ("embed", "expert"), dtype=jnp.float32,
                                init=L.kernel_init(cfg, cfg.ffn_init_scale), flat_kernel=False,
                                gradient_rules=cfg.gradient_rules, name="router")
        probs_BLE = jax.nn.softmax(router(gate_x_BLD).astype(jnp.float32), axis=-1)
        if cfg.ffn_layer == "switch":
            combine_BLEC, aux = top1_routing(probs_BLE, capacity, valid_BL)
        else:
            uniform_BL = None if deterministic else jax.random.uniform(
                self.make_rng("dropout"), probs_BLE.shape[:2])
            combine_BLEC, aux = top2_routing(probs_BLE, capacity, uniform_BL, valid_BL)
        self.sow(AUX_COLLECTION, "load_balancing", cfg.moe_aux_loss_weight * aux,
                 init_fn=lambda: jnp.zeros((), jnp.float32), reduce_fn=jnp.add)
        dispatch_BLEC = (combine_BLEC > 0).astype(dtype)
        in_EBCD = jnp.einsum("blec,bld->ebcd", dispatch_BLEC, x_BLD.astype(dtype))
        in_EBCD = L.constrain(in_EBCD, ("expert", "batch", None, "embed"))
        h_EBCF = self._hidden(in_EBCD, e, d, f, dtype)
        h_EBCF = L.constrain(h_EBCF, ("expert", "batch", None, "mlp"))
        h_EBCF = nn.Dropout(cfg.dropout_rate)(h_EBCF, deterministic=deterministic)
        wo = self._kernel("wo", (e, f, d), ("expert", "mlp", "embed"))
        out_EBCD = jnp.einsum("ebcf,efd->ebcd", h_EBCF, wo.astype(dtype))
        out_EBCD = L.constrain(out_EBCD, ("expert", "batch", None, "embed"))
        return jnp.einsum("blec,ebcd->bld", combine_BLEC.astype(dtype), out_EBCD)

    def _kernel(self, name, shape, axes):
        """An expert-stacked kernel, fan-in initialised per expert like a dense kernel."""
        init = L.kernel_init(self.cfg, self.cfg.ffn_init_scale)
        return self.param(name, nn.with_logical_partitioning(
            lambda key, shape, dtype=jnp.float32: jax.vmap(
                lambda k: init(k, shape[1:], dtype))(jax.random.split(key, shape[0])), axes),
            shape, jnp.float32)

    def _hidden(self, in_EBCD, e, d, f, dtype):
        act = L.ACTIVATIONS[self.cfg.ffn]
        names = ("wi_0", "wi_1") if self.cfg.ffn in L.GATED else ("wi",)
        h = [jnp.einsum("ebcd,edf->ebcf", in_EBCD, self._kernel(
            n, (e, d, f), ("expert", "embed", "mlp")).astype(dtype)) for n in names]
        return act(h[0]) * h[1] if len(h) == 2 else act(h[0])


# model.ffn_layer="moe" (GShard top-2) / "switch" (top-1), registered in models/plan.py: they
# route only the real tokens and size a decoder layer's capacity by the decoder's factor
MOE = FFNLayer("moe", SparseMLP, routed=True)
SWITCH = FFNLayer("switch", SparseMLP, routed=True)


def sown_aux_loss(variables):
    """The sum of every load-balancing term a forward pass sowed (0.0 when none)."""
    leaves = jax.tree.leaves(variables.get(AUX_COLLECTION, {}))
    return sum((jnp.sum(x) for x in leaves), jnp.zeros((), jnp.float32))


def apply_with_aux_loss(model, variables, *args, **kwargs):
    """model.apply(...) -> outputs, with outputs["aux_loss"] (the weighted load-balancing
    loss of every mixture-of-experts layer) when the forward pass sowed any."""
    outputs, sown = model.apply(variables, *args, mutable=[AUX_COLLECTION], **kwargs)
    if jax.tree.leaves(sown.get(AUX_COLLECTION, {})):
        outputs = dict(outputs, aux_loss=sown_aux_loss(sown))
    return outputs
