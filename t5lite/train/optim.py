"""Optimizers (optax) and learning-rate schedules.

- adafactor: T5's optimizer: factored second moments, update clipping at RMS 1.0, updates
  scaled by the parameter's RMS (min 1e-3), no momentum, decay rate 0.8; used with the rsqrt
  schedule (T5: peak 1e-2, warmup 10k = 1/sqrt(max(step, 1e4))).
- adamw: decoupled weight decay on matrices (ndim >= 2) only; with optim.bias_correction=False
  Mesh TF's AdamWeightDecayOptimizer (no bias correction of the moments).
- adamw_rms_scaled: nanoT5's AdamWScale: the Adam update times max(1e-3, RMS(param)), which
  lets AdamW use Adafactor-like learning rates (nanoT5: 2e-2 with cosine).
A config's frozen params and gradual unfreezing (t5lite.peft) wrap it: `optimizer_for(cfg)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from t5lite import peft
from t5lite.errors import UserError


def make_schedule(opt_cfg, total_steps: int):
    """step -> learning rate.

    rsqrt:    peak * sqrt(warmup / max(step, warmup)): constant for `warmup` steps, then 1/sqrt
              decay (exactly T5's 1/sqrt(max(step, 10000)) with peak=0.01, warmup=10000);
              times min(1, step / ramp_steps) with optim.ramp_steps (Mesh TF's
              truncated_rsqrt * linear_warmup).
    constant / cosine / linear: linear warmup from peak/warmup to peak over `warmup` steps, then
              constant / cosine / linear decay to peak * min_lr_ratio at total_steps.
    """
    peak, warmup = opt_cfg.learning_rate, max(int(opt_cfg.warmup_steps), 0)
    floor = peak * opt_cfg.min_lr_ratio
    decay_steps = max(total_steps - warmup, 1)

    if opt_cfg.ramp_steps and opt_cfg.schedule != "rsqrt":
        raise UserError("optim.ramp_steps ramps the rsqrt schedule: set optim.schedule="
                        "rsqrt, or optim.ramp_steps=0 (the other schedules warm up "
                        "linearly over optim.warmup_steps).")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        if opt_cfg.schedule == "rsqrt":
            ramp = jnp.minimum(1.0, step / opt_cfg.ramp_steps) if opt_cfg.ramp_steps else 1.0
            return ramp * peak * jnp.sqrt(max(warmup, 1) / jnp.maximum(step, max(warmup, 1)))
        ramp = jnp.minimum(1.0, (step + 1.0) / warmup) if warmup else 1.0
        progress = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
        if opt_cfg.schedule == "constant":
            decayed = peak
        elif opt_cfg.schedule == "cosine":
            decayed = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        elif opt_cfg.schedule == "linear":
            decayed = peak + (floor - peak) * progress
        else:
            raise UserError(f"unknown optim.schedule {opt_cfg.schedule!r}")
        return jnp.where(step < warmup, peak * ramp, decayed)

    return schedule


def decay_mask(params):
    """Weight decay on matrices only (not on biases, norm scales)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def scale_by_adam_uncorrected(b1: float, b2: float, eps: float
                              ) -> optax.GradientTransformation:
    """Adam's direction from its raw moments, as Mesh TF's AdamWeightDecayOptimizer
    (mesh_tensorflow/optimize.py :171-174): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
    update = m / (sqrt(v) + eps), with no division by 1 - b^t (optax's scale_by_adam has no
    switch for it). Its state is optax's ScaleByAdamState: the same tree as with the
    correction."""
    def init(params):
        return optax.ScaleByAdamState(jnp.zeros([], jnp.int32),
                                      jax.tree.map(jnp.zeros_like, params),
                                      jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
        out = jax.tree.map(lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype),
                           mu, nu, updates)
        return out, optax.ScaleByAdamState(optax.safe_increment(state.count), mu, nu)

    return optax.GradientTransformation(init, update)


def _adam(opt_cfg) -> optax.GradientTransformation:
    """Adam's scaling: optax's (bias-corrected) or Mesh TF's (optim.bias_correction=False)."""
    if opt_cfg.bias_correction:
        return optax.scale_by_adam(b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps)
    return scale_by_adam_uncorrected(opt_cfg.b1, opt_cfg.b2, opt_cfg.eps)


def make_optimizer(opt_cfg, total_steps: int, trainable_mask=None) -> optax.GradientTransformation:
    """The optimizer named by opt_cfg; `trainable_mask` (pytree of bools like params) freezes the
    False leaves: they get zero updates and no optimizer state."""
    lr = make_schedule(opt_cfg, total_steps)
    if not opt_cfg.bias_correction and opt_cfg.name == "adafactor":
        raise UserError("optim.bias_correction=False is Adam's (Mesh TF's "
                        "AdamWeightDecayOptimizer): set optim.name=adamw, or leave it True "
                        "with adafactor.")
    if opt_cfg.name == "adafactor":
        tx = optax.adafactor(
            learning_rate=lr, min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0,
            multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None,
            eps=1e-30, factored=True,
            weight_decay_rate=opt_cfg.weight_decay or None, weight_decay_mask=decay_mask)
    elif opt_cfg.name == "adamw":
        # optax.adamw's own chain, with the Adam scaling chosen by optim.bias_correction
        tx = optax.chain(_adam(opt_cfg),
                         optax.add_decayed_weights(opt_cfg.weight_decay, mask=decay_mask),
                         optax.scale_by_learning_rate(lr))
    elif opt_cfg.name == "adamw_rms_scaled":
        tx = optax.chain(
            _adam(opt_cfg),
            optax.scale_by_param_block_rms(min_scale=1e-3),
            optax.add_decayed_weights(opt_cfg.weight_decay, mask=decay_mask),
            optax.scale_by_learning_rate(lr))
    else:
        raise UserError(f"unknown optim.name {opt_cfg.name!r}: use adafactor, adamw or "
                        "adamw_rms_scaled")
    if opt_cfg.clip_grad_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(opt_cfg.clip_grad_norm), tx)
    if trainable_mask is not None:
        labels = jax.tree.map(lambda t: "train" if t else "freeze", trainable_mask)
        tx = optax.multi_transform({"train": tx, "freeze": optax.set_to_zero()}, labels)
    return tx


def optimizer_for(cfg, total_steps: int, params=None, trainable=None):
    """make_optimizer with the trainable mask and gradual unfreezing of ``cfg.model.peft``
    (cfg: a full Config): what the trainer and `t5lite compile` step with. ``params``:
    (abstract) params, built from the config when None and needed; ``trainable``: an explicit
    mask overriding the config's."""
    mcfg, p = cfg.model, cfg.model.peft
    if params is None and ((trainable is None and peft.needs_mask(mcfg)) or p.unfreeze_every):
        from t5lite.models import abstract_params
        params = abstract_params(mcfg, modules=peft.stack_modules(mcfg))
    if trainable is None:
        trainable = peft.grad_mask(mcfg, params)
    tx = make_optimizer(cfg.optim, total_steps, trainable)
    if p.unfreeze_every:
        tx = peft.gradual_unfreeze(peft.Unfreeze(peft.unfreeze_groups(mcfg, params),
                                                 p.unfreeze_every, p.unfreeze_layers), tx)
    return tx
