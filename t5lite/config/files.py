"""Config files and their round trips: load ``configs/*.py`` (``get_config() -> Config``) with
dotted ``--set`` overrides, and the dict form saved beside checkpoints (to_dict / from_dict,
with LEGACY_VALUES for fields added after a config was saved).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing

from t5lite.config import python_files
from t5lite.config.dotted import copy_config, set_by_path
from t5lite.config.rules import decode_length, validate
from t5lite.config.schema import SECTION_PATHS, Config, UnknownKeyError, unknown_key
from t5lite.errors import UserError


def configs_dir() -> str:
    """The repository's configs/ folder (also found when running from an installed copy)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "configs")


def resolve_config_path(path: str) -> str:
    """Accept 'configs/x.py', an absolute path, or a bare name like 'quickstart'."""
    candidates = [path, os.path.join(configs_dir(), path),
                  os.path.join(configs_dir(), path + ".py")]
    if path.startswith("configs/"):
        candidates.append(os.path.join(configs_dir(), path[len("configs/"):]))
    for c in candidates:
        if os.path.isfile(c):
            return c
    known = sorted(available_configs())
    hint = difflib.get_close_matches(os.path.basename(path).removesuffix(".py"), known, n=3)
    raise UserError(f"config file {path!r} not found."
                    + (f" Did you mean: {', '.join(hint)}?" if hint else "")
                    + " Run `t5lite models` to list the configs.")


def available_configs() -> list[str]:
    """Names of config files under configs/ (recursively), without '.py'."""
    names = []
    root = configs_dir()
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and not f.startswith("_"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                names.append(rel[:-3])
    return names


def load_config(path: str, overrides: typing.Sequence[str] = ()) -> Config:
    """Load ``get_config()`` from a config file, apply ``key=value`` overrides, validate: a
    frozen Config (derive a changed one with replace)."""
    file = resolve_config_path(path)
    try:
        module = python_files.load(file, "t5lite_config_" + os.path.basename(file)[:-3])
        if not hasattr(module, "get_config"):
            raise UserError(f"{file} must define get_config() returning t5lite.config.Config.")
        cfg = module.get_config()
    except UnknownKeyError as e:  # a misspelt field assigned in the file: say where
        raise UserError(f"{_error_location(e, file)}: {e} Fix the config file there.") from None
    except UserError:
        raise
    except SyntaxError as e:
        raise UserError(f"{e.filename or file}:{e.lineno}: syntax error in the config file: "
                        f"{e.msg}. Fix that line.") from None
    except Exception as e:  # noqa: BLE001 - NameError, ImportError ... inside the config file
        typo = _unknown_keyword(e)
        raise UserError(f"{_error_location(e, file)}: " + (
            f"{typo} Fix the config file there." if typo else
            f"{type(e).__name__}: {e}. Fix the config file there.")) from None
    if not isinstance(cfg, Config):
        raise UserError(f"get_config() in {file} returned {type(cfg).__name__}, not Config.")
    cfg = apply_overrides(cfg, overrides)
    validate(cfg)
    return cfg


def load_editable(path: str, overrides: typing.Sequence[str] = ()) -> Config:
    """An unfrozen copy of load_config(path, overrides), for a config file's get_config() to
    build on by assignment (load_config validates and freezes what get_config returns)."""
    return copy_config(load_config(path, overrides))


def replace(cfg: Config, changes: typing.Mapping | typing.Sequence[str]) -> Config:
    """A validated, frozen copy of ``cfg`` with dotted keys changed: ``{"train.steps": 20}``
    (typed values, or strings parsed like --set values) or ``["train.steps=20"]``."""
    if isinstance(changes, typing.Mapping):
        new = copy_config(cfg)
        for key, value in changes.items():
            set_by_path(new, key, value)
    else:
        new = apply_overrides(cfg, changes)
    return validate(new)


def cpu_recipe(base: str, name: str, steps: int, every: int, log_every: int = 10) -> Config:
    """What the configs/tiny_*.py runs share (a few minutes on a laptop CPU): config `base`
    (a model config), AdamW (50 warmup steps, weight decay 0.01), batch 32, no z-loss,
    `steps` steps, an eval and a checkpoint every `every` steps. The caller sets the task,
    lengths, learning rate and schedule (on the returned config, which is not frozen yet)."""
    cfg = load_editable(base)
    cfg.name = name
    cfg.data.batch_size = 32
    cfg.optim.name, cfg.optim.warmup_steps, cfg.optim.weight_decay = "adamw", 50, 0.01
    cfg.train.steps, cfg.train.z_loss, cfg.train.log_every = steps, 0.0, log_every
    cfg.train.eval_every = cfg.checkpoint.every_steps = every
    return cfg


def _unknown_keyword(err: BaseException) -> str:
    """For ``TrainConfig(stpes=20)`` in a config file, the unknown-key message with the
    field meant (the dataclass's own TypeError names neither the section's path nor it)."""
    match = re.fullmatch(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'",
                         str(err))
    if not isinstance(err, TypeError) or not match:
        return ""
    cls = next((c for c in SECTION_PATHS if c.__name__ == match[1]), None)
    return str(unknown_key(cls, match[2])) if cls else ""


def _error_location(err: BaseException, file: str) -> str:
    """'path:line' of the innermost traceback frame inside a config file (the one named, or a
    config file it imports), else the file."""
    import traceback
    frames = traceback.extract_tb(err.__traceback__)
    root = os.path.dirname(os.path.abspath(file))
    inside = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(file)
              or os.path.abspath(f.filename).startswith(configs_dir() + os.sep)
              or os.path.dirname(os.path.abspath(f.filename)) == root]
    if inside:
        return f"{inside[-1].filename}:{inside[-1].lineno}"
    return file


def apply_overrides(cfg: Config, overrides: typing.Sequence[str]) -> Config:
    """A copy of ``cfg`` with ``section.field=value`` strings applied (not validated)."""
    cfg = copy_config(cfg)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r} must look like section.field=value, "
                            "e.g. train.steps=100")
        key, raw = item.split("=", 1)
        set_by_path(cfg, key.strip(), raw.strip())
    return cfg


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


# Fields whose value for a config saved before they existed is not today's default (what
# that config trained with): from_dict and workdir.config_diff read a missing key as this.
LEGACY_VALUES = {"model.flat_kernels": False}


def from_dict(d: dict) -> Config:
    """Inverse of to_dict (used to reload the config saved next to a checkpoint)."""
    cfg = Config()
    seen = set()
    for section, values in d.items():
        if section == "name":
            cfg.name = values
            continue
        for k, v in flatten(values).items():
            set_by_path(cfg, f"{section}.{k}", tuple(v) if isinstance(v, list) else v)
            seen.add(f"{section}.{k}")
    for key, value in LEGACY_VALUES.items():
        if key not in seen:
            set_by_path(cfg, key, value)
    return cfg


def flatten(d: dict) -> dict:
    """A config dict (to_dict's) -> {"section.key": value}; feature_lengths stays one value."""
    from flax import traverse_util  # here: importing flax (and jax) would slow `t5lite models`
    return traverse_util.flatten_dict(
        d, sep=".", is_leaf=lambda path, _: bool(path) and path[-1] == "feature_lengths")


def with_decode_length(cfg: Config) -> Config:
    """cfg with decode.max_length resolved (rules.decode_length: 0 follows the targets
    length); cfg itself when already set."""
    if cfg.decode.max_length:
        return cfg
    return replace(cfg, {"decode.max_length": decode_length(cfg)})
