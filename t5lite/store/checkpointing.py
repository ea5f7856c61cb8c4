"""Checkpoints (orbax): async save every N steps, keep K, exact resume, another mesh, partial
restore for finetuning, fallback from a corrupt newest checkpoint.

Layout of a workdir:
    config.json                         the resolved Config
    checkpoints/<step>/params/          unboxed params (orbax StandardSave): the same format as
                                        a params-only dir's params/ (CONTRACTS.md)
    checkpoints/<step>/opt/             {"step", "opt_state"}
    data_state/<step>/process_<i>.*     this process's tf.data iterator (tf.train.Checkpoint)

Exact data resume uses tf.data iterator checkpointing (as T5X does) rather than skipping ahead:
restoring is O(1) whatever the step, and shuffle / packing buffers come back exactly. The state
is written synchronously before the (async) orbax save of the same step, and restored only
together with that step. Arrays are restored onto whatever shardings the caller asks for, so a
checkpoint written on 8 devices restores on 1 or 2 (or a different mesh).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite import progress
from t5lite.store import failed_reads, gcs
from t5lite.store.paths import abspath, write_atomic

log = logging.getLogger("t5lite")


def _abstract(tree):
    """Concrete or abstract arrays -> ShapeDtypeStructs carrying their shardings."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree)


def has_data_state(it) -> bool:
    """The iterator's position can be checkpointed: pipeline.ShardedBatches or tf.data."""
    return hasattr(it, "save_state") or _is_tf_iterator(it)


def _is_tf_iterator(it) -> bool:
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover
        return False
    return isinstance(it, tf.data.Iterator)


def _configure_orbax() -> None:
    """On CPU, save each array from one replica: orbax's replica-parallel default slices every
    replicated shard with a separate small jit (seconds per save for nothing on host memory)."""
    if jax.default_backend() == "cpu":
        absl_log = logging.getLogger("absl")
        level = absl_log.level
        absl_log.setLevel(logging.ERROR)  # orbax warns that it overrides its default handler
        try:
            ocp.type_handlers.register_type_handler(
                jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                override=True)
        finally:
            absl_log.setLevel(level)


def all_hosts_ok(ok: bool) -> bool:
    """True when ``ok`` holds on every process (a collective: all processes must call it)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils
    return bool(np.min(multihost_utils.process_allgather(np.int32(ok))))


class Checkpointer:
    """Owns workdir/checkpoints and workdir/data_state for one training run."""

    def __init__(self, workdir: str, ckpt_cfg):
        self.workdir = abspath(workdir)
        self.dir = os.path.join(self.workdir, "checkpoints")
        self.data_dir = os.path.join(self.workdir, "data_state")
        self.cfg = ckpt_cfg
        self.data_iter_dirty = False
        _configure_orbax()
        self.manager = ocp.CheckpointManager(
            self.dir,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=ckpt_cfg.keep if ckpt_cfg.keep > 0 else None,
                enable_async_checkpointing=ckpt_cfg.async_save, create=True,
                cleanup_tmp_directories=True))

    # ------------------------------------------------------------------ save
    def should_save(self, step: int, last_step: int) -> bool:
        every = self.cfg.every_steps
        return step == last_step or (every > 0 and step % every == 0)

    def save(self, step: int, state, data_iter=None) -> None:
        """Save `state` (a TrainState) at `step`; the caller checked it is finite."""
        if data_iter is not None and has_data_state(data_iter):
            with _data_state_dir(os.path.join(self.data_dir, str(step)), "w") as directory:
                if hasattr(data_iter, "save_state"):
                    data_iter.save_state(directory)
                else:
                    import tensorflow as tf
                    prefix = os.path.join(directory, f"process_{jax.process_index()}")
                    tf.train.Checkpoint(iterator=data_iter).write(prefix)
        self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state})),
            force=True)
        self._prune_data_state(keep={step})

    def _prune_data_state(self, keep=()) -> None:
        data_dir = epath.Path(self.data_dir)
        if jax.process_index() != 0 or not data_dir.is_dir():
            return
        live = set(self.manager.all_steps()) | set(keep)
        for child in data_dir.iterdir():
            name = child.name
            if name.isdigit() and int(name) not in live and int(name) < max(live, default=0):
                child.rmtree(missing_ok=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        if self.manager.is_saving_in_progress() and jax.process_index() == 0:
            print("t5lite: waiting for the last checkpoint's writes to finish ...", flush=True)
        self.manager.wait_until_finished()
        self.manager.close()

    # ------------------------------------------------------------------ restore
    def latest_step(self):
        return self.manager.latest_step()

    def restore_latest(self, state_like, data_iter=None):
        """Restore the newest readable checkpoint onto the shardings of `state_like` (a TrainState
        of arrays or ShapeDtypeStructs), with the data iterator's position of the same step.
        A step whose arrays or data state are damaged (or unreadable) is moved to
        workdir/corrupt_checkpoints/ with a warning and the previous one is used; arrays of
        other shapes or dtypes than `state_like` are a UserError, never "corruption".
        -> (state, step) or (None, 0). Sets data_iter_dirty when data_iter was touched by a
        failed restore and no step was restored (the caller makes a fresh one)."""
        abstract = _abstract(state_like)
        self.data_iter_dirty = False
        # a damaged step's other failed shard reads cost no asyncio tracebacks
        with progress.quiet_failed_reads() as reads:
            return self._restore_newest_readable(abstract, state_like, data_iter, reads)

    def _restore_newest_readable(self, abstract, state_like, data_iter, reads):
        for step in sorted(self.manager.all_steps(), reverse=True):
            self._check_shapes(step, abstract)
            error = None
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract.params),
                    opt=ocp.args.StandardRestore(
                        {"step": abstract.step, "opt_state": abstract.opt_state})))
            except Exception as e:  # noqa: BLE001 - any read error means "unusable"
                error, reads.failed = e, True
                failed_reads.reported(os.path.join(self.dir, str(step)))
            # Every host must restore the same step: one host's read error (its shard, its
            # disk) makes the step unusable for all, or they would train from different states.
            if not all_hosts_ok(error is None):
                self._quarantine(step, error or RuntimeError(
                    "another host could not read its part of this checkpoint"))
                continue
            if data_iter is not None:
                try:
                    self.restore_data(step, data_iter)
                except Exception as e:  # noqa: BLE001 - deleted, truncated, garbage ...
                    error = e
                    self.data_iter_dirty = True
                if not all_hosts_ok(error is None):
                    self._quarantine(step, error or RuntimeError(
                        "another host could not read its data iterator state"),
                        what="data iterator state")
                    continue
            self.data_iter_dirty = False
            state = state_like.replace(step=restored.opt["step"], params=restored.params,
                                       opt_state=restored.opt["opt_state"])
            return state, step
        return None, 0

    def _check_shapes(self, step: int, abstract) -> None:
        """UserError when step's saved arrays have other shapes / dtypes than `abstract` (a
        changed model or optimizer config). Unreadable metadata is left to the restore."""
        absl_log = logging.getLogger("absl")
        level = absl_log.level
        absl_log.setLevel(logging.ERROR)  # "Metadata file does not exist" (a per-item file)
        try:
            with ocp.StandardCheckpointer() as reader:
                saved = [reader.metadata(os.path.join(self.dir, str(step), item)).item_metadata
                         .tree for item in ("params", "opt")]
            saved = [(tuple(m.shape), np.dtype(m.dtype)) for m in jax.tree.leaves(saved)]
        except Exception:  # noqa: BLE001 - damaged metadata: the restore decides
            return
        finally:
            absl_log.setLevel(level)
        want = {"params": abstract.params,
                "opt": {"step": abstract.step, "opt_state": abstract.opt_state}}
        want = [(tuple(a.shape), np.dtype(a.dtype)) for a in jax.tree.leaves(want)]
        if sorted(saved, key=str) == sorted(want, key=str):
            return
        only_saved = sorted(set(saved) - set(want), key=str)[:3]
        only_want = sorted(set(want) - set(saved), key=str)[:3]
        fmt = lambda xs: ", ".join(f"{list(s)} {d}" for s, d in xs) or "-"  # noqa: E731
        raise UserError(
            f"checkpoint step {step} in {self.dir} holds arrays of other shapes or dtypes than "
            f"this config's model and optimizer ({len(saved)} saved vs {len(want)} expected; "
            f"only saved: {fmt(only_saved)}; only expected: {fmt(only_want)}): it was written "
            "with another model.* / optim.* config. Use the workdir's config.json, or a new "
            "--workdir with --set checkpoint.init_from=<this workdir>")

    def _quarantine(self, step: int, err: Exception, what: str = "checkpoint") -> None:
        msg = (f"checkpoint step {step} in {self.dir} is unreadable ({what}: "
               f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}); "
               "falling back to the previous one")
        log.warning(msg)
        print(f"t5lite: warning: {msg}", flush=True)
        failure = None
        if jax.process_index() == 0:
            failure = self._move_aside(step)
        if jax.process_count() > 1:  # the others list the steps only after the move
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"t5lite_quarantine_{step}")
        if not all_hosts_ok(failure is None):
            raise UserError(
                f"checkpoint step {step} in {self.dir} is unreadable and could not be moved "
                f"aside ({failure or 'on process 0'}); move it out of {self.dir} or fix its "
                "permissions (chmod -R u+rwX), then rerun")
        self.manager.reload()

    def _move_aside(self, step: int):
        """checkpoints/<step> (and data_state/<step>) -> corrupt_checkpoints/<step>.<time>.
        A directory without write permission (mode 000) cannot change parent, so it is then
        renamed in place to checkpoints/<step>.unreadable.<time>, which orbax ignores.
        -> None, or the error when neither worked."""
        stamp = int(time.time())
        src = epath.Path(self.dir) / str(step)
        bad = epath.Path(self.workdir) / "corrupt_checkpoints"
        try:
            bad.mkdir(parents=True, exist_ok=True)
            _rename(src, bad / f"{step}.{stamp}")
        except OSError:
            try:
                _rename(src, epath.Path(self.dir) / f"{step}.unreadable.{stamp}")
            except OSError as e:
                return f"{type(e).__name__}: {e}"
        data = epath.Path(self.data_dir) / str(step)
        try:
            if data.exists():
                bad.mkdir(parents=True, exist_ok=True)
                _rename(data, bad / f"{step}.{stamp}.data_state")
        except OSError:
            pass  # a new save of this step overwrites it; nothing depends on it any more
        return None

    def restore_data(self, step: int, data_iter) -> None:
        """Raises when the step's data iterator state is missing or damaged."""
        with _data_state_dir(os.path.join(self.data_dir, str(step)), "r") as directory:
            if hasattr(data_iter, "restore_state"):
                data_iter.restore_state(directory)
                return
            prefix = os.path.join(directory, f"process_{jax.process_index()}")
            if not _is_tf_iterator(data_iter):
                raise UserError("exact resume needs a tf.data iterator (from "
                                f"pipeline.get_dataset); got {type(data_iter).__name__}")
            if not epath.Path(prefix + ".index").exists():
                raise FileNotFoundError(f"no data iterator state {prefix}.index")
            import tensorflow as tf
            tf.train.Checkpoint(iterator=data_iter).read(prefix).assert_consumed()


def _rename(src, dst) -> None:
    """epath's rename, but on gs:// through gcs.move: GCS has no folders, and epath refuses a
    destination whose parent holds no object yet (a first corrupt_checkpoints/ entry)."""
    if gcs.is_gcs(src):
        gcs.move(src, dst)
    else:
        src.rename(dst)


def _data_state_dir(directory: str, mode: str):
    """The folder a tf.data iterator state is written to ("w") or read from ("r"): itself when
    local; on gs:// a local copy (TensorFlow's GCS filesystem honours no emulator setting, so
    only epath touches the bucket: store/gcs.py)."""
    if not gcs.is_gcs(directory):
        return contextlib.nullcontext(directory)
    return gcs.staged_upload(directory) if mode == "w" else gcs.staged_download(directory)


# ---------------------------------------------------------------------- params-only dirs
# A params-only dir (best/, peft/<step>/, convert import / merge-lora output) is
#     config.json    the Config the params belong to
#     params/        orbax StandardSave of the (unboxed) param tree, as checkpoints/<step>/params
#     <name>.json    optional metadata (best/metrics.json, peft/<step>/peft_only.json)
# save_params_dir is its only writer and load_params / read_metadata its only readers, so the
# layout lives here once and every path may be local or gs:// (epath, orbax; never open()).


def save_params_dir(path: str, cfg, params, metadata=None, overwrite: bool = False) -> str:
    """Write a params-only dir: path/params (all processes call this: orbax saves collectively),
    then, on process 0, config.json and each `metadata` {"name.json": JSON-able} atomically.
    An existing path/params is a UserError unless `overwrite` (best/ and peft/<step> replace
    theirs). `params` may be any subset of a model's tree (PEFT saves only what it trains).
    -> the absolute path."""
    path = abspath(path)
    root = epath.Path(path)
    if not overwrite and (root / "params").exists():
        raise UserError(f"{path}/params already exists; choose a new destination or delete it.")
    root.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(root / "params", params, force=overwrite)
        ckptr.wait_until_finished()
    if jax.process_index() == 0:
        write_atomic(root / "config.json", json.dumps(config_lib.to_dict(cfg), indent=2))
        for name, value in (metadata or {}).items():
            write_atomic(root / name, json.dumps(value, indent=2))
    return path


def read_metadata(path: str, name: str):
    """path/name (a params-only dir's metadata JSON) as a value, or None when absent."""
    f = epath.Path(abspath(path)) / name
    return json.loads(f.read_text()) if f.exists() else None



def _find_params_dir(path: str, step: int = -1):
    """-> (params_dir, config_json_path) for a params-only dir, a workdir or a step dir."""
    path = abspath(path)
    if epath.Path(path, "checkpoints").is_dir():  # training workdir
        mgr = ocp.CheckpointManager(os.path.join(path, "checkpoints"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
        steps = sorted(mgr.all_steps(), reverse=True)
        mgr.close()
        if step >= 0:
            if step not in steps:
                raise UserError(f"{path} has no checkpoint at step {step}; it has {sorted(steps)}")
            steps = [step]
        if not steps:
            raise UserError(f"{path} has no finished checkpoints yet")
        cands = [os.path.join(path, "checkpoints", str(s), "params") for s in steps]
        return cands, os.path.join(path, "config.json")
    if epath.Path(path, "params").is_dir():
        cfg = os.path.join(path, "config.json")
        if not epath.Path(cfg).exists():  # step dir: workdir/checkpoints/<step>
            cfg = os.path.join(os.path.dirname(os.path.dirname(path)), "config.json")
        return [os.path.join(path, "params")], cfg
    raise UserError(f"{path} is not a t5lite checkpoint: expected a params-only dir "
                    "(config.json + params/), a training workdir (config.json + checkpoints/) "
                    "or a step dir (checkpoints/<step>)")


def check_init_from(ckpt_cfg, workdir: str) -> None:
    """UserError now, before a run writes anything, when checkpoint.init_from will be read
    (the workdir has no checkpoint to resume yet) and names no checkpoint with a config."""
    if not ckpt_cfg.init_from:
        return
    saved = epath.Path(workdir) / "checkpoints"
    if saved.is_dir() and any(p.name.isdigit() for p in saved.iterdir()):
        return  # a resume: init_from is not read again (it may be gone by now)
    _, cfg_path = _find_params_dir(ckpt_cfg.init_from, ckpt_cfg.init_step)
    if not epath.Path(cfg_path).exists():
        load_config_json(cfg_path)  # its message: the config.json is needed


def load_config_json(path: str):
    if not epath.Path(path).exists():
        raise UserError(f"missing {path}: the checkpoint's config.json is needed to rebuild "
                        "the model")
    return config_lib.from_dict(json.loads(epath.Path(path).read_text()))


def load_params(path: str, abstract_params=None, step: int = -1):
    """-> (Config, params) from a params-only dir, a workdir (latest readable step, or `step`)
    or a step dir. With `abstract_params` (ShapeDtypeStructs with shardings and the same tree)
    arrays land sharded; otherwise on the first local device."""
    cands, cfg_path = _find_params_dir(path, step)
    cfg = load_config_json(cfg_path)
    last_err = None
    with ocp.StandardCheckpointer() as ckptr, progress.quiet_failed_reads() as reads:
        for params_dir in cands:
            try:
                if abstract_params is None:
                    meta = ckptr.metadata(params_dir).item_metadata.tree
                    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
                    target = jax.tree.map(
                        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=dev),
                        meta)
                else:
                    target = abstract_params
                return cfg, ckptr.restore(params_dir, target)
            except Exception as e:  # noqa: BLE001
                reads.failed = True
                failed_reads.reported(params_dir)
                last_err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                log.warning("params at %s unreadable (%s); trying the previous step",
                            params_dir, last_err)  # not TensorStore's spec
    raise UserError(f"no readable params under {path}: {last_err}")


def load_opt_state(path: str, abstract_opt, step: int = -1):
    """The step and optimizer state of a training workdir's checkpoint (its latest readable
    step, or `step`), restored onto ``abstract_opt`` ({"step", "opt_state"} ShapeDtypeStructs
    with shardings): -> (step, {"step", "opt_state"}), or (step, None) when the saved optimizer
    state has another layout than ``abstract_opt`` (another optimizer, a PEFT mask)."""
    cands, _ = _find_params_dir(path, step)
    opt_dirs = [os.path.join(os.path.dirname(c), "opt") for c in cands]
    if not epath.Path(opt_dirs[0]).is_dir():
        raise UserError(f"checkpoint.init_state: {path} holds no optimizer state (a params-only "
                        "dir); point checkpoint.init_from at the pretraining workdir")
    with ocp.StandardCheckpointer() as ckptr, progress.quiet_failed_reads() as reads:
        for opt_dir in opt_dirs:
            saved_step = int(os.path.basename(os.path.dirname(opt_dir)))
            try:
                saved = ckptr.metadata(opt_dir).item_metadata.tree
            except Exception:  # noqa: BLE001 - unreadable: try the previous step
                reads.failed = True
                continue
            if _leaf_shapes(saved) != _leaf_shapes(abstract_opt):
                return saved_step, None
            try:
                return saved_step, ckptr.restore(opt_dir, abstract_opt)
            except Exception as e:  # noqa: BLE001
                reads.failed = True
                failed_reads.reported(opt_dir)
                log.warning("optimizer state at %s unreadable (%s); trying the previous step",
                            opt_dir, f"{type(e).__name__}")
    raise UserError(f"no readable optimizer state under {path}")


def _leaf_shapes(tree) -> list:
    """The (shape, dtype) of every leaf, sorted: a layout check that ignores container types
    (orbax's metadata tree holds dicts where the optimizer state has named tuples)."""
    return sorted(((tuple(x.shape), str(np.dtype(x.dtype))) for x in jax.tree.leaves(tree)),
                  key=str)


def merge_params(target, source, announce=print):
    """Partial restore for finetuning: take every source param whose path and shape match the
    target; keep the target's fresh init for the rest (e.g. a new classification head); ignore
    source params the target lacks. Both are nested dicts; logs what was not transferred."""
    flat_t = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(target)}
    flat_s = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(source)}
    missing = sorted(set(flat_t) - set(flat_s))
    extra = sorted(set(flat_s) - set(flat_t))
    for k in set(flat_t) & set(flat_s):
        # equal shapes, or a kernel saved [in..., out...] loaded [fan_in, fan_out] or back
        if not joined_shapes(tuple(flat_s[k].shape), tuple(flat_t[k].shape)):
            raise UserError(
                f"init_from: parameter {k} has shape {tuple(flat_s[k].shape)} in the checkpoint "
                f"but {tuple(flat_t[k].shape)} in this model; make the model config match the "
                "pretrained one (e.g. model.vocab_size, d_model, num_heads)")
    if missing:
        announce(f"init_from: {len(missing)} params not in the checkpoint keep their fresh "
                 f"init: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if extra:
        announce(f"init_from: {len(extra)} checkpoint params unused by this model: "
                 f"{', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}")

    def pick(path, t):
        s = flat_s.get(jax.tree_util.keystr(path))
        if s is None:
            return t
        return jax.device_put(np.asarray(s).astype(t.dtype).reshape(t.shape), t.sharding)

    return jax.tree_util.tree_map_with_path(pick, target)


def joined_shapes(a: tuple, b: tuple) -> bool:
    """Whether one shape is the other with runs of adjacent dims joined (each dim of the
    coarser is the product of consecutive dims of the finer, in order): then a row-major
    reshape maps each element to its place, as between a kernel stored [D, H, K]
    (model.flat_kernels=false) and [D, H*K]. Equal shapes count; [D, F] vs [F, D] does not."""
    def refines(fine, coarse):
        it = iter(fine)
        for d in coarse:
            n = 1
            while n < d:
                n *= next(it, 0) or d + 1  # exhausted: overshoot
            if n != d:
                return False
        return all(x == 1 for x in it)
    return refines(a, b) or refines(b, a)
