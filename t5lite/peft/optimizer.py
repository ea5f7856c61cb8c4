"""The optimizer of a PEFT config: ``optim.make_optimizer`` given the trainable mask and the
gradual-unfreezing groups of ``cfg.model.peft``."""

from __future__ import annotations

from t5lite.peft.masks import grad_mask, needs_mask
from t5lite.peft.modules import stack_modules
from t5lite.peft.unfreeze import unfreeze_groups


def make_optimizer(cfg, total_steps: int, params=None, trainable=None):
    """optim.make_optimizer with the trainable mask and gradual unfreezing of ``cfg.model``
    (cfg: a full Config). ``params``: (abstract) params, built from the config when None and
    needed; ``trainable``: an explicit mask overriding the config's."""
    # imported here: t5lite.train imports this package
    from t5lite.train import optim
    mcfg, p = cfg.model, cfg.model.peft
    if params is None and ((trainable is None and needs_mask(mcfg)) or p.unfreeze_every):
        from t5lite.models import abstract_params
        params = abstract_params(mcfg, modules=stack_modules(mcfg))
    if trainable is None:
        trainable = grad_mask(mcfg, params)
    unfreeze = None
    if p.unfreeze_every:
        unfreeze = optim.Unfreeze(unfreeze_groups(mcfg, params), p.unfreeze_every,
                                  p.unfreeze_layers)
    return optim.make_optimizer(cfg.optim, total_steps, trainable, unfreeze)
