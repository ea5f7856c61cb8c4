"""Parameter-efficient finetuning: LoRA, prompt tuning, prefix tuning, adapters, (IA)^3,
layer freezing and gradual unfreezing (``cfg.model.peft``, a PeftConfig).

Model hooks: ``Attention`` / ``MLP`` subclass the core layers through their extension methods
(layers.py never imports this module), ``Adapter`` follows a block's MLP, ``prompt_param`` /
``prepend_prompt`` give the prompted stack its soft prompt. The PEFT params live inside the
modules they adapt, so they are scanned with the layers (a leading [num_layers] axis) when
scan_layers=True, and the base params keep their T5X names:

    .../{query,key,value,out,wi,wo,...}/lora_a   [in..., r]    (LoRA A, fan-in init)
    .../{query,key,value,out,wi,wo,...}/lora_b   [r, out...]   (LoRA B, zeros: step 0 = base)
    .../{attention,self_attention,encoder_decoder_attention}/ia3_key, ia3_value  [H, K] (ones)
    .../mlp/ia3_mlp                              [F] (ones)
    .../layers/mlp_adapter/{layer_norm,wi,wo}/...  (after the MLP; wo = 0)
    .../{attention,self_attention}/prefix_key, prefix_value  [N, H, K]
    encoder/prompt (decoder/prompt for decoder-only models)  [N, D]

Parameter-tree rules (pure functions of a ModelConfig and a params tree): ``trainable_mask``,
``unfreeze_groups``, ``count_trainable`` / ``describe``, ``peft_subset``, ``merge_lora``. The
masks are data for ``optim.make_optimizer`` (``make_optimizer`` below is the glue) and for the
trainer's trainable-subset gradients (``grad_mask``). PEFT-only files (``save_peft`` /
``load_peft``) are params-only checkpoint dirs of the trained subset.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import UserError
from t5lite.models import layers as L

LORA_NAMES = ("lora_a", "lora_b")
IA3_NAMES = ("ia3_key", "ia3_value", "ia3_mlp")
PREFIX_NAMES = ("prefix_key", "prefix_value")
ADAPTER_SUFFIX = "_adapter"
PROMPT_NAME = "prompt"
PEFT_MARKER = "peft_only.json"


def enabled(mcfg) -> bool:
    """Any PEFT method on in this ModelConfig (freezing alone does not count)."""
    p = mcfg.peft
    return bool(p.lora_rank or p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3)


def check(mcfg) -> None:
    """PEFT config errors, with what to do (mcfg: ModelConfig; the rules:
    config.rules.check_peft)."""
    from t5lite import config as config_lib
    config_lib.check_peft(mcfg)


# ============================================================================ model hooks


def lora_kwargs(mcfg, name: str) -> dict:
    """DenseGeneral fields that give the dense layer ``name`` LoRA when it is a target."""
    p = mcfg.peft
    if p.lora_rank and any(fnmatch.fnmatchcase(name, t) for t in p.lora_targets):
        return {"lora_rank": p.lora_rank, "lora_alpha": p.lora_alpha}
    return {}


def ia3_scale(module: nn.Module, name: str, x, axes):
    """(IA)^3: x times a learned vector over its trailing len(axes) dims, initialised to ones
    (Liu et al., 2022), so the model starts as the base model."""
    shape = x.shape[-len(axes):]
    scale = module.param(name, nn.with_logical_partitioning(nn.initializers.ones, axes),
                         shape, jnp.float32)
    return x * scale.astype(x.dtype)


def add_prefix(module: nn.Module, mcfg, k_BSHK, v_BSHK, bias_BHTS):
    """Prefix tuning (Li & Liang, 2021): N learned keys / values prepended to this layer's
    self-attention keys / values; every query sees them (bias 0, no position)."""
    n, b = mcfg.peft.prefix_tokens, k_BSHK.shape[0]
    shape = (n, mcfg.num_heads, mcfg.head_dim)
    axes = (None, "heads", "kv")
    init = nn.initializers.normal(0.02 if mcfg.init_std <= 0 else mcfg.init_std)
    pk = module.param("prefix_key", nn.with_logical_partitioning(init, axes), shape, jnp.float32)
    pv = module.param("prefix_value", nn.with_logical_partitioning(init, axes), shape,
                      jnp.float32)
    pk = jnp.broadcast_to(pk.astype(k_BSHK.dtype), (b,) + shape)
    pv = jnp.broadcast_to(pv.astype(v_BSHK.dtype), (b,) + shape)
    pad = [(0, 0)] * (bias_BHTS.ndim - 1) + [(n, 0)]
    return (jnp.concatenate([pk, k_BSHK], axis=1), jnp.concatenate([pv, v_BSHK], axis=1),
            jnp.pad(bias_BHTS, pad))


class Attention(L.MultiHeadAttention):
    """MultiHeadAttention with LoRA on its target projections, (IA)^3 on keys / values and
    (self-attention only) a prefix-tuning prefix."""

    def dense_kwargs(self, name: str) -> dict:
        return lora_kwargs(self.cfg, name)

    def adapt_kv(self, k_BSHK, v_BSHK):
        if not self.cfg.peft.ia3:
            return k_BSHK, v_BSHK
        return (ia3_scale(self, "ia3_key", k_BSHK, ("heads", "kv")),
                ia3_scale(self, "ia3_value", v_BSHK, ("heads", "kv")))

    def extend_kv(self, k_BSHK, v_BSHK, bias_BHTS):
        if not self.cfg.peft.prefix_tokens or self.cross:
            return k_BSHK, v_BSHK, bias_BHTS
        return add_prefix(self, self.cfg, k_BSHK, v_BSHK, bias_BHTS)


class MLP(L.MLP):
    """MLP with LoRA on its target projections and (IA)^3 on the hidden activations."""

    def dense_kwargs(self, name: str) -> dict:
        return lora_kwargs(self.cfg, name)

    def adapt_hidden(self, h_BLF):
        return ia3_scale(self, "ia3_mlp", h_BLF, ("mlp",)) if self.cfg.peft.ia3 else h_BLF


class Adapter(nn.Module):
    """The T5 paper's adapter layer (Section 3.5.1, Table 10): x + wo(relu(wi(norm(x)))), a
    dense-ReLU-dense block (no biases, as T5's dense layers) with its own layer norm and
    residual, after each feed-forward sub-layer; ``wo`` starts at zero, so the adapter is the
    identity at init."""

    cfg: Any

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
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


class BlockModules(NamedTuple):
    """What a transformer Block builds its sub-layers from."""

    attention: type  # a MultiHeadAttention class
    mlp: type  # an MLP class
    adapter: Optional[type]  # a module after the MLP sub-layer, or None


def block_modules(mcfg) -> BlockModules:
    """The core layers when PEFT is off, else their PEFT subclasses (same names and params)."""
    if not enabled(mcfg):
        return BlockModules(L.MultiHeadAttention, L.MLP, None)
    return BlockModules(Attention, MLP, Adapter if mcfg.peft.adapter_dim else None)


def prompted_stack(mcfg) -> str:
    """Which stack receives the soft prompt: the encoder, or the decoder of decoder-only models
    ("" when prompt tuning is off)."""
    if not mcfg.peft.prompt_tokens:
        return ""
    return "encoder" if mcfg.architecture in ("encoder_decoder", "encoder_only") else "decoder"


def prompt_param(module: nn.Module, mcfg):
    """The soft prompt [N, D] (Lester et al., 2021), initialised like the token embeddings."""
    return module.param(PROMPT_NAME, nn.with_logical_partitioning(
        L.embed_init(mcfg), (None, "embed")), (mcfg.peft.prompt_tokens, mcfg.d_model),
        jnp.float32)


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


def trainable_mask(mcfg, params):
    """Pytree of bools like ``params``: True = trained.

    Order of rules: with PEFT on and ``train_only_peft``, only PEFT params and ``train_also``
    train; then ``freeze`` globs freeze whatever they match. Freezing alone (no PEFT) trains
    everything that no ``freeze`` glob matches.
    """
    p = mcfg.peft
    leaves, treedef = _leaves(params)
    only_peft = enabled(mcfg) and p.train_only_peft
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


def needs_mask(mcfg) -> bool:
    return enabled(mcfg) or bool(mcfg.peft.freeze)


def grad_mask(mcfg, params):
    """The params that need gradients, or None (all): the static trainable mask. Gradual
    unfreezing opens a growing subset of it inside one compiled step, so it keeps the whole
    mask's gradients and zeroes the closed layers in the optimizer."""
    return trainable_mask(mcfg, params) if needs_mask(mcfg) else None


def count_trainable(params, mask=None) -> tuple[int, int]:
    """(trainable, total) number of parameters (``mask`` None = everything trains)."""
    leaves = [x for _, x in _leaves(params)[0]]
    flags = [True] * len(leaves) if mask is None else jax.tree.leaves(mask)
    total = sum(math.prod(x.shape) for x in leaves)
    train = sum(math.prod(x.shape) for x, t in zip(leaves, flags) if t)
    return train, total


def describe(mcfg, params) -> str:
    """The log line: trainable params and which PEFT methods are on."""
    train, total = count_trainable(params, grad_mask(mcfg, params))
    p = mcfg.peft
    methods = [m for m, on in (("lora", p.lora_rank), ("prompt", p.prompt_tokens),
                               ("prefix", p.prefix_tokens), ("adapters", p.adapter_dim),
                               ("ia3", p.ia3), ("freeze", p.freeze),
                               ("gradual_unfreeze", p.unfreeze_every)) if on]
    return (f"trainable params: {train:,} of {total:,} ({100.0 * train / max(total, 1):.3f}%)"
            + (f" [{', '.join(methods)}]" if methods else ""))


def _embedding_is_output_layer(mcfg) -> bool:
    """The token embedding doubles as the output layer (tied LM head of T5 v1.0 / GPT)."""
    return mcfg.tie_embeddings and mcfg.architecture != "encoder_only"


def unfreeze_groups(mcfg, params):
    """Pytree like params of int arrays broadcastable to each leaf: the unfreezing group, i.e.
    the step (in units of ``unfreeze_every``) from which a parameter trains. As in the T5 paper
    (Sec. 3.5.1, after Howard and Ruder 2018): group 0 is the top layer of every stack with
    everything above it (final norms, heads, the output layer); layer i of a stack of n layers
    is group n-1-i, so encoder and decoder open in parallel from the top; the input embeddings
    (and soft prompt, relative-position bias) open with the bottom layer, so that the last
    episode trains the entire network, except a token embedding tied to the output layer, which
    trains throughout ("since the parameters of our input embedding matrix and output
    classification matrix are shared, we update them throughout fine-tuning")."""
    stack = {"encoder": mcfg.num_encoder_layers, "decoder": mcfg.num_decoder_layers}
    bottom = total_layers(mcfg) - 1
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
                "token_embedder" in parts and not _embedding_is_output_layer(mcfg)):
            group = np.array(bottom)
        out.append(group)
    return jax.tree_util.tree_unflatten(treedef, out)


def total_layers(mcfg) -> int:
    """Layer groups opened one by one: the deepest stack (encoder and decoder go in parallel)."""
    if mcfg.architecture == "encoder_only":
        return mcfg.num_encoder_layers
    if mcfg.architecture == "encoder_decoder" and not mcfg.shared_encoder_decoder:
        return max(mcfg.num_encoder_layers, mcfg.num_decoder_layers)
    return mcfg.num_decoder_layers


def opened_groups(mcfg, step):
    """Groups < this train at optimizer step ``step`` (0-based) under gradual unfreezing
    (traceable)."""
    from t5lite.train import optim
    return optim.opened_groups(mcfg.peft.unfreeze_every, mcfg.peft.unfreeze_layers, step)


def make_optimizer(cfg, total_steps: int, params=None, trainable=None):
    """optim.make_optimizer with the trainable mask and gradual unfreezing of ``cfg.model``
    (cfg: a full Config). ``params``: (abstract) params, built from the config when None and
    needed; ``trainable``: an explicit mask overriding the config's."""
    from t5lite.train import optim
    mcfg, p = cfg.model, cfg.model.peft
    if params is None and ((trainable is None and needs_mask(mcfg)) or p.unfreeze_every):
        from t5lite.models import abstract_params
        params = abstract_params(mcfg)
    if trainable is None:
        trainable = grad_mask(mcfg, params)
    unfreeze = None
    if p.unfreeze_every:
        unfreeze = optim.Unfreeze(unfreeze_groups(mcfg, params), p.unfreeze_every,
                                  p.unfreeze_layers)
    return optim.make_optimizer(cfg.optim, total_steps, trainable, unfreeze)


# ============================================================================ save / load / merge


def peft_subset(mcfg, params) -> dict:
    """The trained params only (PEFT params and train_also heads) as a nested dict."""
    from flax import traverse_util
    mask = trainable_mask(mcfg, params)
    flat = {}
    for (path, leaf), t in zip(_leaves(params)[0], jax.tree.leaves(mask)):
        if t:
            flat[path_str(path)] = leaf
    return traverse_util.unflatten_dict(flat, sep="/")


def save_peft(path: str, cfg, params) -> None:
    """Write a params-only checkpoint (CONTRACTS.md: config.json + params/) holding only the
    trained params, marked by a ``peft_only.json`` (their paths and counts). A few KB to MB
    instead of the whole model; ``load_peft`` puts it on top of a base checkpoint.
    ``cfg``: the full Config (saved as config.json)."""
    subset = peft_subset(cfg.model, params)
    train, total = count_trainable(params, trainable_mask(cfg.model, params))
    from t5lite.store import checkpointing
    checkpointing.save_params_dir(path, cfg, subset, {PEFT_MARKER: {
        "trainable_params": train, "model_params": total,
        "paths": sorted(path_str(p) for p, _ in _leaves(subset)[0])}}, overwrite=True)


def save_with_checkpoint(cfg, workdir: str, step: int, params) -> None:
    """Trainer hook: with PEFT on (and model.peft.save_peft_params), write workdir/peft/<step>/
    beside checkpoints/<step>/ and keep the newest checkpoint.keep of them."""
    from etils import epath
    from t5lite.store import checkpointing
    if not (enabled(cfg.model) and cfg.model.peft.save_peft_params):
        return
    root = epath.Path(checkpointing.abspath(workdir)) / "peft"
    save_peft(str(root / str(step)), cfg, params)
    keep = cfg.checkpoint.keep
    if jax.process_index() == 0 and keep > 0:
        steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
        for old in steps[:-keep]:
            (root / str(old)).rmtree()


def load_peft(path: str, base_params):
    """-> (Config, params): ``base_params`` (e.g. from checkpointing.load_params of the base
    model, or a fresh init) with the saved PEFT params of ``path`` put on top."""
    from etils import epath
    from t5lite.store import checkpointing
    path = checkpointing.abspath(path)
    cfg_file = epath.Path(path) / "config.json"
    if not (epath.Path(path) / PEFT_MARKER).exists() or not cfg_file.exists():
        raise UserError(f"{path} is not a PEFT params dir (config.json + {PEFT_MARKER} + "
                        "params/), as written by peft.save_peft / training with "
                        "model.peft.save_peft_params (workdir/peft/<step>)")
    cfg, saved = checkpointing.load_params(path)
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


def merge_lora(mcfg, params):
    """Fold LoRA into the base kernels: W' = W + (alpha / r) A B. -> (mcfg without LoRA,
    params without lora_a / lora_b); works for scanned ([layers, ...]) and unrolled params."""
    rank, scale = mcfg.peft.lora_rank, mcfg.peft.lora_alpha / max(mcfg.peft.lora_rank, 1)
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
    return dataclasses.replace(mcfg, peft=dataclasses.replace(mcfg.peft, lora_rank=0)), merged
