"""Parameter-efficient finetuning: LoRA, prompt tuning, prefix tuning, adapters, (IA)^3,
layer freezing and gradual unfreezing (cfg.model.peft, a PeftConfig).

Model side: small hooks called by layers.py / transformer.py add the PEFT params inside the
modules they adapt, so they are scanned with the layers (a leading [num_layers] axis) when
scan_layers=True, and the base params keep their T5X names:

    .../{query,key,value,out,wi,wo,...}/lora_a   [in..., r]    (LoRA A, fan-in init)
    .../{query,key,value,out,wi,wo,...}/lora_b   [r, out...]   (LoRA B, zeros: step 0 = base)
    .../{attention,self_attention,encoder_decoder_attention}/ia3_key, ia3_value  [H, K] (ones)
    .../mlp/ia3_mlp                              [F] (ones)
    .../layers/mlp_adapter/{layer_norm,wi,wo}/...  (after the MLP; wo = 0)
    .../{attention,self_attention}/prefix_key, prefix_value  [N, H, K]
    encoder/prompt (decoder/prompt for decoder-only models)  [N, D]

Training side: ``trainable_mask`` (which leaves train), ``make_optimizer`` (frozen leaves go
through optax.set_to_zero: bit-identical, no optimizer state; gradual unfreezing masks the
rest by layer depth inside the jitted update, so nothing recompiles), ``count_trainable`` /
``describe``, ``save_peft`` / ``load_peft`` (PEFT-only params beside the checkpoint) and
``merge_lora`` (fold LoRA into the base kernels for export).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite.errors import UserError

LORA_NAMES = ("lora_a", "lora_b")
IA3_NAMES = ("ia3_key", "ia3_value", "ia3_mlp")
PREFIX_NAMES = ("prefix_key", "prefix_value")
ADAPTER_SUFFIX = "_adapter"
PROMPT_NAME = "prompt"
PEFT_MARKER = "peft_only.json"


def _peft(cfg):
    """PeftConfig from a PeftConfig, ModelConfig or Config."""
    cfg = getattr(cfg, "model", cfg)
    return getattr(cfg, "peft", cfg)


def enabled(cfg) -> bool:
    """Any PEFT method on (freezing alone does not count)."""
    p = _peft(cfg)
    return bool(p.lora_rank or p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3)


def check(cfg) -> None:
    """PEFT config errors, with what to do (cfg: ModelConfig)."""
    p = cfg.peft
    for name in ("lora_rank", "prompt_tokens", "prefix_tokens", "adapter_dim"):
        if getattr(p, name) < 0:
            raise UserError(f"model.peft.{name} must be >= 0, got {getattr(p, name)}")
    if p.lora_rank and not p.lora_targets:
        raise UserError("model.peft.lora_rank>0 needs model.peft.lora_targets, e.g. "
                        "query,value (names of dense layers: query key value out wi wo ...)")
    if p.unfreeze_every < 0 or p.unfreeze_layers < 1:
        raise UserError("model.peft.unfreeze_every must be >= 0 and unfreeze_layers >= 1")


# ============================================================================ model hooks


def lora_kwargs(cfg, name: str) -> dict:
    """DenseGeneral kwargs that give the dense layer ``name`` LoRA when it is a target."""
    p = cfg.peft
    if p.lora_rank and any(fnmatch.fnmatchcase(name, t) for t in p.lora_targets):
        return {"lora_rank": p.lora_rank, "lora_alpha": p.lora_alpha}
    return {}


def lora_delta(module: nn.Module, x, n_in: int, features: tuple, kernel_axes, rank: int,
               alpha: float, dtype):
    """(alpha / r) * (x A) B for a DenseGeneral contracting x's last ``n_in`` dims.

    A [in..., r] has the kernel's input axes (fan-in init); B [r, out...] starts at zero so
    the adapted layer equals the base layer at step 0 (Hu et al., 2021).
    """
    in_shape = x.shape[-n_in:]

    def a_init(key, shape, dtype=jnp.float32):
        flat = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")(
            key, (int(np.prod(in_shape)), rank), dtype)
        return flat.reshape(shape)

    a = module.param("lora_a", nn.with_logical_partitioning(
        a_init, tuple(kernel_axes[:n_in]) + (None,)), in_shape + (rank,), jnp.float32)
    b = module.param("lora_b", nn.with_logical_partitioning(
        nn.initializers.zeros, (None,) + tuple(kernel_axes[n_in:])), (rank,) + features,
        jnp.float32)
    contract = tuple(range(x.ndim - n_in, x.ndim))
    h = jax.lax.dot_general(x.astype(dtype), a.astype(dtype),
                            ((contract, tuple(range(n_in))), ((), ())))
    y = jnp.tensordot(h, b.astype(dtype), axes=1)
    return y * jnp.asarray(alpha / rank, dtype)


def ia3_scale(module: nn.Module, name: str, x, axes):
    """(IA)^3: x times a learned vector over its trailing len(axes) dims, initialised to ones
    (Liu et al., 2022), so the model starts as the base model."""
    shape = x.shape[-len(axes):]
    scale = module.param(name, nn.with_logical_partitioning(nn.initializers.ones, axes),
                         shape, jnp.float32)
    return x * scale.astype(x.dtype)


class Adapter(nn.Module):
    """The T5 paper's adapter layer (Section 3.5.1, Table 10): x + wo(relu(wi(norm(x)))), a
    dense-ReLU-dense block (no biases, as T5's dense layers) with its own layer norm and
    residual, after each feed-forward sub-layer; ``wo`` starts at zero, so the adapter is the
    identity at init."""

    cfg: Any

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
        from t5lite.models import layers as L
        cfg = self.cfg
        dtype = L.compute_dtype(cfg)
        h = L.make_norm(cfg, "layer_norm")(x_BLD)
        h = L.DenseGeneral((cfg.peft.adapter_dim,), ("embed", None), dtype=dtype,
                           init=nn.initializers.variance_scaling(1.0, "fan_in",
                                                                 "truncated_normal"),
                           name="wi")(h)
        y = L.DenseGeneral((cfg.d_model,), (None, "embed"), dtype=dtype,
                           init=nn.initializers.zeros, name="wo")(nn.relu(h))
        return x_BLD + nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)


def adapter(cfg):
    """The adapter after a block's feed-forward sub-layer, or None when adapters are off."""
    return Adapter(cfg, name="mlp" + ADAPTER_SUFFIX) if cfg.peft.adapter_dim else None


def add_prefix(module: nn.Module, cfg, k_BSHK, v_BSHK, bias_BHTS):
    """Prefix tuning (Li & Liang, 2021): N learned keys / values prepended to this layer's
    self-attention keys / values; every query sees them (bias 0, no position)."""
    n, b = cfg.peft.prefix_tokens, k_BSHK.shape[0]
    shape = (n, cfg.num_heads, cfg.head_dim)
    axes = (None, "heads", "kv")
    init = nn.initializers.normal(0.02 if cfg.init_std <= 0 else cfg.init_std)
    pk = module.param("prefix_key", nn.with_logical_partitioning(init, axes), shape, jnp.float32)
    pv = module.param("prefix_value", nn.with_logical_partitioning(init, axes), shape,
                      jnp.float32)
    pk = jnp.broadcast_to(pk.astype(k_BSHK.dtype), (b,) + shape)
    pv = jnp.broadcast_to(pv.astype(v_BSHK.dtype), (b,) + shape)
    pad = [(0, 0)] * (bias_BHTS.ndim - 1) + [(n, 0)]
    return (jnp.concatenate([pk, k_BSHK], axis=1), jnp.concatenate([pv, v_BSHK], axis=1),
            jnp.pad(bias_BHTS, pad))


def prompted_stack(cfg) -> str:
    """Which stack receives the soft prompt: the encoder, or the decoder of decoder-only models
    ("" when prompt tuning is off)."""
    if not cfg.peft.prompt_tokens:
        return ""
    return "encoder" if cfg.architecture in ("encoder_decoder", "encoder_only") else "decoder"


def prompt_param(module: nn.Module, cfg):
    """The soft prompt [N, D] (Lester et al., 2021), initialised like the token embeddings."""
    from t5lite.models import layers as L
    return module.param(PROMPT_NAME, nn.with_logical_partitioning(
        L.embed_init(cfg), (None, "embed")), (cfg.peft.prompt_tokens, cfg.d_model), jnp.float32)


def prepend_prompt(prompt_ND, x_BLD, mask_BLS, q_valid_BL, positions_BL):
    """Prepend the prompt to the embedded tokens and extend mask and positions.

    Real tokens see the prompt and their own segment as before; prompt tokens see only the
    prompt (so packed examples cannot leak into each other through it). Prompt tokens carry
    position 0 and no position embedding; real tokens keep their positions.
    """
    b, n = x_BLD.shape[0], prompt_ND.shape[0]
    p_BND = jnp.broadcast_to(prompt_ND.astype(x_BLD.dtype), (b,) + prompt_ND.shape)
    x_BLD = jnp.concatenate([p_BND, x_BLD], axis=1)
    l = mask_BLS.shape[1]
    top = jnp.concatenate([jnp.ones((b, n, n), bool), jnp.zeros((b, n, l), bool)], axis=2)
    bottom = jnp.concatenate([jnp.broadcast_to(q_valid_BL[:, :, None], (b, l, n)), mask_BLS],
                             axis=2)
    mask_BLS = jnp.concatenate([top, bottom], axis=1)
    positions_BL = jnp.concatenate([jnp.zeros((b, n), positions_BL.dtype), positions_BL], axis=1)
    return x_BLD, mask_BLS, positions_BL


# ============================================================================ which params train


def path_str(path) -> str:
    """A jax key path -> "encoder/layers/attention/query/kernel"."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def is_peft_param(path: str) -> bool:
    parts = path.split("/")
    return (parts[-1] in LORA_NAMES + IA3_NAMES + PREFIX_NAMES or parts[-1] == PROMPT_NAME
            or any(p.endswith(ADAPTER_SUFFIX) for p in parts))


def _leaves(params):
    return jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))


def trainable_mask(cfg, params):
    """Pytree of bools like ``params``: True = trained.

    Order of rules: with PEFT on and ``train_only_peft``, only PEFT params and ``train_also``
    train; then ``freeze`` globs freeze whatever they match. Freezing alone (no PEFT) trains
    everything that no ``freeze`` glob matches.
    """
    p = _peft(cfg)
    leaves, treedef = _leaves(params)
    only_peft = enabled(p) and p.train_only_peft
    mask = []
    for path, _ in leaves:
        s = path_str(path)
        train = not only_peft or is_peft_param(s) or any(
            fnmatch.fnmatchcase(s, g) for g in p.train_also)
        if any(fnmatch.fnmatchcase(s, g) for g in p.freeze):
            train = False
        mask.append(train)
    if leaves and not any(mask):
        raise UserError("model.peft leaves no parameter trainable (freeze patterns match "
                        "everything?); loosen model.peft.freeze")
    return jax.tree_util.tree_unflatten(treedef, mask)


def needs_mask(cfg) -> bool:
    p = _peft(cfg)
    return enabled(p) or bool(p.freeze)


def count_trainable(params, mask=None) -> tuple[int, int]:
    """(trainable, total) number of parameters (``mask`` None = everything trains)."""
    leaves = [x for _, x in _leaves(params)[0]]
    flags = [True] * len(leaves) if mask is None else jax.tree.leaves(mask)
    total = sum(math.prod(x.shape) for x in leaves)
    train = sum(math.prod(x.shape) for x, t in zip(leaves, flags) if t)
    return train, total


def describe(cfg, params) -> str:
    """The log line: trainable params and which PEFT methods are on."""
    mask = trainable_mask(cfg, params) if needs_mask(cfg) else None
    train, total = count_trainable(params, mask)
    p = _peft(cfg)
    methods = [m for m, on in (("lora", p.lora_rank), ("prompt", p.prompt_tokens),
                               ("prefix", p.prefix_tokens), ("adapters", p.adapter_dim),
                               ("ia3", p.ia3), ("freeze", p.freeze),
                               ("gradual_unfreeze", p.unfreeze_every)) if on]
    return (f"trainable params: {train:,} of {total:,} ({100.0 * train / max(total, 1):.3f}%)"
            + (f" [{', '.join(methods)}]" if methods else ""))


# ============================================================================ optimizer


class UnfreezeState(NamedTuple):
    count: jax.Array
    inner: Any


def _embedding_is_output_layer(m) -> bool:
    """The token embedding doubles as the output layer (tied LM head of T5 v1.0 / GPT)."""
    return m.tie_embeddings and m.architecture != "encoder_only"


def unfreeze_groups(cfg, params):
    """Pytree like params of int arrays broadcastable to each leaf: the unfreezing group, i.e.
    the step (in units of ``unfreeze_every``) from which a parameter trains. As in the T5 paper
    (Sec. 3.5.1, after Howard and Ruder 2018): group 0 is the top layer of every stack with
    everything above it (final norms, heads, the output layer); layer i of a stack of n layers
    is group n-1-i, so encoder and decoder open in parallel from the top; the input embeddings
    (and soft prompt, relative-position bias) open with the bottom layer, so that the last
    episode trains the entire network, except a token embedding tied to the output layer, which
    trains throughout ("since the parameters of our input embedding matrix and output
    classification matrix are shared, we update them throughout fine-tuning")."""
    m = getattr(cfg, "model", cfg)
    stack = {"encoder": m.num_encoder_layers, "decoder": m.num_decoder_layers}
    bottom = total_layers(cfg) - 1
    bottom_names = ("position_embedder", "token_type_embedder", "embed_norm", "relpos_bias",
                    PROMPT_NAME)
    leaves, treedef = _leaves(params)
    out = []
    for path, leaf in leaves:
        parts = path_str(path).split("/")
        group = np.array(0)
        if parts[0] in stack and len(parts) > 1 and parts[1] == "layers":
            n = leaf.shape[0]
            group = (n - 1 - np.arange(n)).reshape((n,) + (1,) * (len(leaf.shape) - 1))
        elif parts[0] in stack and len(parts) > 1 and parts[1].startswith("layers_"):
            group = np.array(stack[parts[0]] - 1 - int(parts[1][len("layers_"):]))
        elif any(p in bottom_names for p in parts) or (
                "token_embedder" in parts and not _embedding_is_output_layer(m)):
            group = np.array(bottom)
        out.append(group)
    return jax.tree_util.tree_unflatten(treedef, out)


def total_layers(cfg) -> int:
    """Layer groups opened one by one: the deepest stack (encoder and decoder go in parallel)."""
    m = getattr(cfg, "model", cfg)
    if m.architecture == "encoder_only":
        return m.num_encoder_layers
    if m.architecture == "encoder_decoder" and not m.shared_encoder_decoder:
        return max(m.num_encoder_layers, m.num_decoder_layers)
    return m.num_decoder_layers


def opened_groups(cfg, step):
    """Groups < this train at optimizer step ``step`` (0-based) under gradual unfreezing
    (traceable)."""
    p = _peft(cfg)
    return p.unfreeze_layers * (step // p.unfreeze_every + 1)


def gradual_unfreeze(cfg, params, inner: optax.GradientTransformation):
    """Wrap ``inner`` so that only groups < opened_groups(step) get gradients and
    updates (exact zeros elsewhere: those params stay bit-identical). The step lives in the
    optimizer state and the mask is computed inside the jitted update: no recompiles."""
    groups = unfreeze_groups(cfg, params)

    def masked(tree, opened):
        return jax.tree.map(lambda x, g: jnp.where(jnp.asarray(g) < opened, x,
                                                   jnp.zeros_like(x)), tree, groups)

    def init(params):
        return UnfreezeState(count=jnp.zeros((), jnp.int32), inner=inner.init(params))

    def update(grads, state, params=None):
        opened = opened_groups(cfg, state.count)
        updates, inner_state = inner.update(masked(grads, opened), state.inner, params)
        return masked(updates, opened), UnfreezeState(count=state.count + 1, inner=inner_state)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg, total_steps: int, params=None, trainable=None):
    """optim.make_optimizer with the PEFT / freezing mask and gradual unfreezing of ``cfg``
    (a full Config). ``params``: (abstract) params, built from the config when None;
    ``trainable``: an explicit mask overriding the config's."""
    from t5lite import optim
    p = _peft(cfg)
    if params is None and (needs_mask(cfg) or p.unfreeze_every) and trainable is None:
        from t5lite.models import abstract_params
        params = abstract_params(cfg.model)
    if trainable is None and needs_mask(cfg):
        trainable = trainable_mask(cfg, params)
    tx = optim.make_optimizer(cfg.optim, total_steps, trainable)
    if p.unfreeze_every:
        if params is None:
            from t5lite.models import abstract_params
            params = abstract_params(cfg.model)
        tx = gradual_unfreeze(cfg, nn.meta.unbox(params), tx)
    return tx


# ============================================================================ save / load / merge


def peft_subset(cfg, params) -> dict:
    """The trained params only (PEFT params and train_also heads) as a nested dict."""
    mask = trainable_mask(cfg, params)
    flat = {}
    for (path, leaf), t in zip(_leaves(params)[0], jax.tree.leaves(mask)):
        if t:
            flat[path_str(path)] = leaf
    return flax_unflatten(flat)


def flax_unflatten(flat: dict) -> dict:
    out: dict = {}
    for key, v in flat.items():
        d = out
        parts = key.split("/")
        for part in parts[:-1]:
            d = d.setdefault(part, {})
        d[parts[-1]] = v
    return out


def save_peft(path: str, cfg, params) -> None:
    """Write a params-only checkpoint (CONTRACTS.md: config.json + params/) holding only the
    trained params, marked by a ``peft_only.json`` (their paths and counts). A few KB to MB
    instead of the whole model; ``load_peft`` puts it on top of a base checkpoint."""
    import orbax.checkpoint as ocp
    from etils import epath
    from t5lite import config as config_lib
    path = _abspath(path)
    subset = peft_subset(cfg, params)
    if jax.process_index() == 0:
        d = epath.Path(path)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(config_lib.to_dict(cfg), indent=2))
        train, total = count_trainable(params, trainable_mask(cfg, params))
        (d / PEFT_MARKER).write_text(json.dumps(
            {"trainable_params": train, "model_params": total,
             "paths": sorted(path_str(p) for p, _ in _leaves(subset)[0])}, indent=1))
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(path, "params"), subset, force=True)
    ckptr.wait_until_finished()


def _abspath(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def save_with_checkpoint(cfg, workdir: str, step: int, params) -> None:
    """Trainer hook: with PEFT on (and model.peft.save_peft_params), write workdir/peft/<step>/
    beside checkpoints/<step>/ and keep the newest checkpoint.keep of them."""
    from etils import epath
    if not (enabled(cfg) and _peft(cfg).save_peft_params):
        return
    root = epath.Path(_abspath(workdir)) / "peft"
    save_peft(str(root / str(step)), cfg, params)
    keep = cfg.checkpoint.keep
    if jax.process_index() == 0 and keep > 0:
        steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
        for old in steps[:-keep]:
            (root / str(old)).rmtree()


def load_peft(path: str, base_params):
    """-> (Config, params): ``base_params`` (e.g. from checkpointing.load_params of the base
    model, or a fresh init) with the saved PEFT params of ``path`` put on top."""
    import orbax.checkpoint as ocp
    from t5lite import config as config_lib
    from etils import epath
    path = _abspath(path)
    cfg_file = epath.Path(path) / "config.json"
    if not (epath.Path(path) / PEFT_MARKER).exists() or not cfg_file.exists():
        raise UserError(f"{path} is not a PEFT params dir (config.json + {PEFT_MARKER} + "
                        "params/), as written by peft.save_peft / training with "
                        "model.peft.save_peft_params (workdir/peft/<step>)")
    cfg = config_lib.from_dict(json.loads(cfg_file.read_text()))
    ckptr = ocp.StandardCheckpointer()
    meta = ckptr.metadata(os.path.join(path, "params")).item_metadata.tree
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    saved = ckptr.restore(os.path.join(path, "params"), jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=dev), meta))
    flat_saved = {path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    leaves, treedef = _leaves(base_params)
    base_keys = {path_str(p) for p, _ in leaves}
    missing = sorted(set(flat_saved) - base_keys)
    if missing:
        raise UserError(f"the base params lack {len(missing)} PEFT params of {path} (e.g. "
                        f"{missing[0]}); build the base model with the PEFT config saved in "
                        f"{cfg_file} (model.peft)")
    out = []
    for p, leaf in leaves:
        v = flat_saved.get(path_str(p))
        if v is None:
            out.append(leaf)
            continue
        if tuple(v.shape) != tuple(leaf.shape):
            raise UserError(f"{path_str(p)}: saved shape {tuple(v.shape)} != base shape "
                            f"{tuple(leaf.shape)}; the base model config differs from the one "
                            "the PEFT params were trained with")
        sharding = getattr(leaf, "sharding", None)
        v = jnp.asarray(v, leaf.dtype)
        out.append(jax.device_put(v, sharding) if sharding is not None else v)
    return cfg, jax.tree_util.tree_unflatten(treedef, out)


def merge_lora(cfg, params):
    """Fold LoRA into the base kernels: W' = W + (alpha / r) A B. -> (cfg without LoRA,
    params without lora_a / lora_b). ``cfg``: Config or ModelConfig (returned as given);
    works for scanned ([layers, ...]) and unrolled params."""
    m = getattr(cfg, "model", cfg)
    rank, scale = m.peft.lora_rank, m.peft.lora_alpha / max(m.peft.lora_rank, 1)
    if not rank:
        raise UserError("merge_lora: model.peft.lora_rank is 0, there is no LoRA to merge")

    def merge(tree):
        if not isinstance(tree, dict):
            return tree
        if "lora_a" in tree and "lora_b" in tree:
            a, b, w = tree["lora_a"], tree["lora_b"], tree["kernel"]
            lead_in = a.shape[:-1]
            feat = w.shape[len(lead_in):]
            lead = b.shape[:b.ndim - 1 - len(feat)]
            n_in = int(np.prod(lead_in[len(lead):]))
            a2 = a.reshape(lead + (n_in, rank)).astype(jnp.float32)
            b2 = b.reshape(lead + (rank, int(np.prod(feat)))).astype(jnp.float32)
            delta = (a2 @ b2).reshape(w.shape) * scale
            rest = {k: v for k, v in tree.items() if k not in LORA_NAMES}
            return {**rest, "kernel": (w.astype(jnp.float32) + delta).astype(w.dtype)}
        return {k: merge(v) for k, v in tree.items()}

    merged = merge(jax.tree.map(lambda x: x, nn.meta.unbox(params)))
    new_peft = dataclasses.replace(m.peft, lora_rank=0)
    new_model = dataclasses.replace(m, peft=new_peft)
    if hasattr(cfg, "model"):
        return dataclasses.replace(cfg, model=new_model), merged
    return new_model, merged


def export_merged(checkpoint: str, out_dir: str) -> str:
    """Load a LoRA checkpoint (any form checkpointing.load_params reads), merge LoRA and write
    a params-only checkpoint of the plain model to ``out_dir``."""
    import orbax.checkpoint as ocp
    from t5lite import checkpointing
    from t5lite import config as config_lib
    cfg, params = checkpointing.load_params(checkpoint)
    cfg, params = merge_lora(cfg, params)
    from etils import epath
    out_dir = _abspath(out_dir)
    if jax.process_index() == 0:
        epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
        (epath.Path(out_dir) / "config.json").write_text(
            json.dumps(config_lib.to_dict(cfg), indent=2))
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(out_dir, "params"), params, force=True)
    ckptr.wait_until_finished()
    return out_dir
