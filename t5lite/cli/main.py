"""The `t5lite` command: train, compile, eval, infer, quickstart, plot, models, tasks, data,
convert, ablate.

Each subcommand parses its flags here and calls one function: in commands.py (what the verbs
do: printing, stdin, output files), or in the module that owns the work where that function
is already the whole command (quickstart, listings, data). This file stays a table of contents.
Heavy imports (jax, tensorflow) happen inside the handlers, so `t5lite --help` is instant.
"""

from __future__ import annotations

import time

_IMPORTED_AT = time.time()  # the command's start: what follows is the user's wait too

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402

from t5lite.errors import Preempted, UserError


def _quiet_env():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "JAX_PLATFORMS" not in os.environ:
        try:  # only CPU here: silence the harmless cuInit message
            import importlib.util
            import glob
            # libtpu without TPU chips (installed by the test extra for `t5lite compile`)
            no_tpu = (importlib.util.find_spec("libtpu") is None
                      or not glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*"))
            if importlib.util.find_spec("jax_cuda12_plugin") is None and no_tpu:
                os.environ["JAX_PLATFORMS"] = "cpu"
        except Exception:  # pragma: no cover
            pass


def _import_tensorflow_quietly():
    """TF 2.21 logs "oneDNN custom operations are on" / "Could not find cuda drivers" through
    absl at load time, before TF_CPP_MIN_LOG_LEVEL applies. Import it once with fd 2 sent to a
    temp file (replayed if the import fails). TF_CPP_MIN_LOG_LEVEL=0 keeps the lines."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
        return
    import tempfile
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def cmd_train(args):
    from t5lite.cli import commands
    commands.train_command(args.config, args.set or [], args.workdir,
                           print_config=args.print_config,
                           allow_config_change=args.allow_config_change,
                           before_training=_import_tensorflow_quietly,
                           resume_from=args.resume_from)


def cmd_compile(args):
    from t5lite.cli import commands
    commands.compile_command(args.config, args.topology, args.set or [], as_json=args.json,
                             do_search=args.search, hbm_gib=args.hbm_gib, decode=args.decode)


def cmd_quickstart(args):
    from t5lite.cli import quickstart
    quickstart.run(args.workdir, fast=args.fast)


def cmd_eval(args):
    from t5lite.cli import commands
    commands.check_overrides(args.set or [])
    _import_tensorflow_quietly()
    if args.shots is not None:  # in-context few-shot prompting (fewshot.py)
        commands.fewshot_command(args.checkpoint, args.task, args.shots, args.split,
                                 args.max_examples, args.template, args.label_words,
                                 args.scoring, args.context_length, args.set or [])
        return
    commands.eval_command(checkpoint=args.checkpoint, task=args.task, split=args.split,
                          max_examples=args.max_examples, overrides=args.set or [])


def cmd_infer(args):
    from t5lite.cli import commands
    commands.check_overrides(args.set or [])
    _import_tensorflow_quietly()
    commands.infer_command(checkpoint=args.checkpoint, input_path=args.input,
                           output_path=args.output, mode=args.mode,
                           options=args.options or [], overrides=args.set or [],
                           prefix=args.prefix)


def cmd_models(args):
    from t5lite.cli import listings
    print(listings.models_table(args.names or ()))


def cmd_tasks(args):
    if args.action == "list":
        from t5lite.cli import listings
        # a terminal gets a table folded to its width (COLUMNS may set it); a pipe or a file,
        # which a script reads, or --wide gets every cell
        width = (None if args.wide or not sys.stdout.isatty()
                 else shutil.get_terminal_size().columns)
        print(listings.tasks_table(args.name or "", width=width,
                                   task_modules=args.task_module or ()))
    else:
        if not args.name:
            raise UserError("`t5lite tasks show` needs a task or mixture name; "
                            "see `t5lite tasks list`.")
        from t5lite.tasks import pipeline, preflight, registered
        pipeline.import_task_modules(args.task_module or ())
        preflight.check_task(args.name, args.split, registered.DEFAULT_LENGTHS)
        print(registered.show_task(args.name, split=args.split, num_examples=args.num_examples))


def cmd_data(args):
    from t5lite import dataprep
    dataprep.use_data_dir(args.data_dir)
    if args.action == "cache":
        if not args.names:
            raise UserError("`t5lite data cache` needs a task or mixture name, e.g. "
                            "`t5lite data cache sentiment`.")
        from t5lite.tasks import beam_cache, cache, tfds_dir
        tfds_dir.use_tfds_data_dir(args.tfds_data_dir)
        if args.runner == "local" and not args.dry_run:
            for name in args.names:
                cache.cache_task(name, splits=args.splits or (), cache_dir=args.cache_dir,
                                 num_shards=args.shards or 1, force=args.force)
            return
        if args.splits and args.runner != "local":
            raise UserError("seqio's Beam pipeline caches every split of a task; --splits "
                            "needs --runner local.")
        beam_cache.run(args.names, runner=args.runner, options=args.pipeline_options or (),
                       cache_dir=args.cache_dir, num_shards=args.shards, force=args.force,
                       tfds_data_dir=args.tfds_data_dir, dry_run=args.dry_run)
        return
    dataprep.prepare(args.names or None, data_dir=args.data_dir or "", force=args.force)


def cmd_convert(args):
    from t5lite.cli import commands
    {"import": commands.import_hf_command, "merge-lora": commands.merge_lora_command,
     "export": commands.export_hf_command}[args.direction](args.src, args.dst)


def cmd_plot(args):
    from t5lite.cli import commands
    commands.plot_command(args.workdirs, args.output, size=args.size, labels=args.labels or ())


def _names(values):  # "--rows a b" and "--rows a,b" both work
    return [n for v in values or () for n in v.split(",") if n]


def cmd_ablate(args):
    from t5lite.cli import commands
    commands.ablate_command(args.table, args.workdir, rows=_names(args.rows),
                            tasks=_names(args.tasks), scale=args.scale,
                            overrides=args.set or [], seeds=args.seeds, dry_run=args.dry_run,
                            list_tables=args.list, estimate=args.estimate,
                            topology=args.topology or "", compiled=args.compiled or "")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default when it has a meaningful one (not None / "" / False)."""

    def _get_help_string(self, action):
        d = action.default
        if d is None or d is False or d == "" or d is argparse.SUPPRESS or "default" in (
                action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _at_least(low: int, meaning: str = ""):
    """An argparse type: an integer >= ``low`` (a count; argparse names the flag in the
    error, before any heavy import)."""
    def count(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}{meaning}, got {value}")
        return value
    return count


# The run directory is --workdir in every command (eval / infer also take a step dir, best/
# or a params-only dir there); --checkpoint, their older name, still works.
CHECKPOINT_FLAGS = dict(dest="checkpoint", metavar="WORKDIR", required=True)


class _TableChoices(list):
    """The ablation tables, listed in --help. Any value passes argparse: `6` means table6, a
    path to a .py is a table of yours, and ablations.load_table refuses an unknown name with
    a suggestion (argparse's "invalid choice" has none)."""

    def __contains__(self, value):
        return True


def build_parser() -> argparse.ArgumentParser:
    from t5lite import __version__
    fmt = _HelpFormatter  # every option shows its default
    p = argparse.ArgumentParser(prog="t5lite", description=__doc__.splitlines()[0],
                                formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"t5lite {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help, **kw):
        return sub.add_parser(name, help=help, description=kw.pop("description", help),
                              formatter_class=fmt, **kw)

    def add_set(sp, what="override a config field, e.g. --set train.steps=100 (repeatable)"):
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help=what)

    sp = add("train", "pretrain or finetune from a config (resumes from WORKDIR)")
    sp.add_argument("--config", required=True,
                    help="configs/NAME.py, a path, or a bare config name")
    add_set(sp)
    sp.add_argument("--workdir", help="checkpoints, metrics.jsonl, TensorBoard events (local "
                    "path or gs://); required unless --print-config")
    sp.add_argument("--print-config", action="store_true",
                    help="print the resolved config (file + --set, validated) as JSON and "
                    "exit without training")
    sp.add_argument("--allow-config-change", action="store_true",
                    help="continue a workdir whose config.json differs in safe keys only "
                    "(train.steps, optim.min_lr_ratio, log / eval / checkpoint cadence, eval.*, "
                    "decode.*); the old config is kept as config.<n>.json")
    sp.add_argument("--resume-from", type=_at_least(0), metavar="STEP",
                    help="resume from this saved checkpoint step rather than the newest: the "
                    "later checkpoints are moved (never deleted) to WORKDIR/set_aside/<UTC "
                    "time>/; with --set train.skip_batches=STEP:N after a loss spike")
    sp.set_defaults(fn=cmd_train)

    sp = add("compile", "compile the train step for a TPU slice on this host (needs libtpu, "
             "no TPU): fits in HBM? roofline bound and expected step time and MFU")
    sp.add_argument("--config", required=True,
                    help="configs/NAME.py, a path, or a bare config name")
    add_set(sp)
    sp.add_argument("--topology", default="",
                    help="gcloud accelerator type (v4-8, v5p-32, v5litepod-16, v6e-8) or JAX "
                         "topology name (v5p:2x2x4); default: the config's mesh.topology")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--search", action="store_true",
                    help="try (data, fsdp, tensor) meshes, remat policies, collective "
                         "matmuls on / off and micro-batch counts; rank those that fit by "
                         "expected step time (a mesh axis given a size with --set is held)")
    sp.add_argument("--hbm-gib", type=float, default=0.0,
                    help="HBM per chip to fit into (default 0: the chip's; lower it for "
                    "headroom)")
    sp.add_argument("--decode", action="store_true",
                    help="compile the decoding program (cfg.decode: method, beams, max_length) "
                         "instead of the train step")
    sp.set_defaults(fn=cmd_compile)

    sp = add("quickstart", "prepare local data, pretrain a tiny T5, finetune it on sentiment")
    sp.add_argument("--workdir", default="runs/quickstart",
                    help="where the pretrain/ and finetune/ runs and summary.json go")
    sp.add_argument("--fast", action="store_true", help="fewer steps (smoke test)")
    sp.set_defaults(fn=cmd_quickstart)

    sp = add("eval", "evaluate a checkpoint on a task with its metrics")
    sp.add_argument("--workdir", "--checkpoint", **CHECKPOINT_FLAGS,
                    help="a training workdir (latest step), a step dir, best/ or a params-only "
                    "dir (convert import, merge-lora)")
    sp.add_argument("--task", required=True,
                    help="seqio task or mixture with metrics (see `t5lite tasks list`)")
    sp.add_argument("--split", default="validation", help="the task's split to evaluate")
    sp.add_argument("--max-examples", type=_at_least(0, " (0: every example)"), default=0,
                    help="evaluate only the first N examples (default 0: all)")
    add_set(sp, "override a field of the checkpoint's config, e.g. decode.method=beam "
            "(repeatable)")
    fs = sp.add_argument_group("in-context few-shot (GPT / T5 checkpoints, finetuning datasets)")
    fs.add_argument("--shots", type=_at_least(0),
                    help="K demonstrations from the train split per prompt "
                    "(default: no few-shot prompting, the task's own evaluation)")
    fs.add_argument("--template", default="", help="review, input_answer, it_was or a prompt "
                    "with {input} (default: the task's, review for sentiment)")
    fs.add_argument("--label-words", default="", help="e.g. negative=terrible,positive=great "
                    "(default: the label names)")
    fs.add_argument("--scoring", default="rank", choices=["rank", "generate"],
                    help="rank: the label word with the highest log-likelihood (default); "
                    "generate: decode and match the label words")
    fs.add_argument("--context-length", type=_at_least(0), default=0,
                    help="prompt tokens (default 0: "
                    "the checkpoint's feature length, capped by its learned positions)")
    sp.set_defaults(fn=cmd_eval)

    sp = add("infer", "write JSONL predictions for input lines")
    sp.add_argument("--workdir", "--checkpoint", **CHECKPOINT_FLAGS,
                    help="a training workdir, step dir, best/ or params-only dir")
    sp.add_argument("--input", required=True, help="text file, one input per line, or -")
    sp.add_argument("--output", default="-", help="JSONL file or - for stdout")
    sp.add_argument("--mode", default="predict", choices=["predict", "score", "rank"],
                    help="predict: decode; score: log-likelihood of 'input<TAB>target' "
                    "lines; rank: pick the best of --options")
    sp.add_argument("--options", action="append",
                    help="rank mode: a candidate target (repeatable)")
    sp.add_argument("--prefix", default="",
                    help="the task's text-to-text prefix, put before every input line, e.g. "
                         "'sst2 sentence:' (`t5lite tasks show NAME` shows a task's inputs)")
    add_set(sp, "decoding options, e.g. decode.method=beam decode.beams=4 (repeatable)")
    sp.set_defaults(fn=cmd_infer)

    sp = add("models", "print each model config's parameter count")
    sp.add_argument("names", nargs="*", help="config names (default: all model configs)")
    sp.set_defaults(fn=cmd_models)

    sp = add("tasks", "list tasks (and whether their data is prepared) / show examples")
    sp.add_argument("action", choices=["list", "show"],
                    help="list: every task and mixture; show: decoded examples of NAME")
    sp.add_argument("name", nargs="?", help="show: the task or mixture; list: only the names "
                    "that contain NAME or match it as a glob (paper_*)")
    sp.add_argument("--split", default="train", help="show: the split to read")
    sp.add_argument("--num-examples", type=_at_least(1), default=3, help="show: how many examples")
    sp.add_argument("--wide", action="store_true",
                    help="list: every cell in full (a terminal otherwise gets the table folded "
                    "to its width)")
    sp.add_argument("--task-module", action="append", metavar="PATH_OR_NAME",
                    help="a module of yours that registers tasks, as data.task_modules: a .py "
                    "path or a module name importable from the current directory (repeatable)")
    sp.set_defaults(fn=cmd_tasks)

    from t5lite.cli import listings
    datasets = listings.dataset_names()
    sp = add("data", "build local corpora, finetuning sets and vocabularies",
             description="Build local corpora, finetuning sets and vocabularies (idempotent). "
             "Datasets: " + ", ".join(datasets) + "; quickstart = corpus, sentiment, "
             "vocab_sp8k.")
    sp.add_argument("action", choices=["prepare", "cache"],
                    help="prepare: build the named datasets; cache: run the named seqio tasks' "
                    "deterministic preprocessing (tokenizing) once into seqio's cache, which "
                    "`--set data.use_cached=true` trains from")
    sp.add_argument("names", nargs="*", metavar="NAME",
                    help="prepare: datasets to build (default: all): " + ", ".join(datasets)
                    + ", quickstart; cache: tasks or mixtures")
    sp.add_argument("--cache-dir", default="",
                    help="cache: where to write (default: DATA_DIR/seqio_cache; then set "
                    "data.cache_dir to it)")
    sp.add_argument("--splits", nargs="+", help="cache: only these splits (default: all)")
    sp.add_argument("--shards", type=_at_least(1), default=0,
                    help="cache: TFRecord files per split (default: local 1, Beam one per "
                    "source shard)")
    sp.add_argument("--runner", default="local",
                    help="cache: local (default): t5lite's one-process writer, which keeps the "
                    "source's order; or a Beam runner for seqio's caching pipeline "
                    "(DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, PortableRunner; "
                    "needs pip install -e '.[beam]')")
    sp.add_argument("--tfds-data-dir", default="",
                    help="cache: the TFDS data dir of TFDS-backed tasks, e.g. gs://BUCKET/tfds")
    sp.add_argument("--dry-run", action="store_true",
                    help="cache: print the tasks and the Beam pipeline options, run nothing")
    sp.add_argument("--pipeline-options", nargs=argparse.REMAINDER, metavar="OPT",
                    help="cache: the rest of the line goes to Beam, e.g. --project=P "
                    "--region=us-central1 --temp_location=gs://B/tmp --setup_file=./setup.py")
    sp.add_argument("--data-dir", default="",
                    help="where to build (default: $T5LITE_DATA_DIR or ~/.cache/t5lite)")
    sp.add_argument("--force", action="store_true",
                    help="rebuild the named datasets (or caches) even when up to date")
    sp.set_defaults(fn=cmd_data)

    sp = add("convert", "import/export Hugging Face T5, BERT, GPT-2 weights; merge LoRA",
             description="import: a local Hugging Face dir -> a t5lite params-only checkpoint. "
             "export: a t5lite checkpoint -> a Hugging Face dir (config.json + "
             "model.safetensors). merge-lora: a LoRA run -> a params-only checkpoint of the "
             "merged model (export that).")
    sp.add_argument("direction", choices=["import", "export", "merge-lora"],
                    help="what to convert")
    sp.add_argument("src", help="import: local HF dir; export / merge-lora: t5lite checkpoint "
                    "(workdir, step dir, best/ or params-only dir)")
    sp.add_argument("dst", help="import / merge-lora: new t5lite checkpoint dir; export: HF dir")
    sp.set_defaults(fn=cmd_convert)

    sp = add("plot", "plot loss, accuracy, learning rate and eval curves to a PNG",
             description="Plot metrics.jsonl of one or more workdirs (overlaid) to a PNG.")
    sp.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="`t5lite train` workdirs")
    sp.add_argument("--output", "-o", default="",
                    help="PNG path (default: WORKDIR/metrics.png for one run, ./metrics.png "
                    "for several)")
    sp.add_argument("--size", default="1400x900", help="WIDTHxHEIGHT in pixels")
    sp.add_argument("--labels", nargs="+", help="legend names, one per workdir (default: the "
                    "parts of the paths that differ)")
    sp.set_defaults(fn=cmd_plot)

    from t5lite import ablations
    sp = add("ablate", "reproduce a T5 paper ablation table (configs/ablations/)")
    sp.add_argument("--table", choices=_TableChoices(ablations.table_names()),
                    help="the paper table (also `6`, or a path to a .py defining TABLE)")
    sp.add_argument("--workdir", help="runs in WORKDIR/<table>/<row>/, WORKDIR/<table>/table.md "
                    "and table.png")
    sp.add_argument("--rows", nargs="+", help="run only these rows, space- or comma-separated "
                    "(default: all)")
    sp.add_argument("--tasks", nargs="+", help="downstream tasks, space- or comma-separated "
                    "(default: the scale's, else the table's)")
    sp.add_argument("--scale", default=None, choices=list(ablations.SCALES),
                    help="tiny (CPU smoke test; the default, but paper for --estimate), small "
                    "(CPU study on topic_debian) or paper (T5 base, C4 + the paper's "
                    "benchmarks, 2^19 + 2^18 steps)")
    sp.add_argument("--seeds", type=_at_least(1), default=1,
                    help="run each row N times (seeds 0..N-1); the table shows mean ± std")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override for every row and stage (repeatable); "
                    "pretrain.KEY=V / finetune.KEY=V: one stage only")
    sp.add_argument("--dry-run", action="store_true",
                    help="print the `t5lite train` / `t5lite eval` commands, train nothing")
    sp.add_argument("--list", action="store_true", help="list the tables and their rows")
    sp.add_argument("--estimate", action="store_true",
                    help="print each row's training steps and tokens, train nothing")
    sp.add_argument("--topology", help="with --estimate: also TPU-hours per row from "
                    "`t5lite compile` on this slice, e.g. v5p-32")
    sp.add_argument("--compiled", metavar="FILE", help="with --topology: stages compiled "
                    "earlier (JSON lines as bench/modifications_compile.jsonl) are read from "
                    "FILE instead of compiled again (lines of another plan or slice are "
                    "unused), and each stage compiled now is appended to it (a local FILE)")
    sp.set_defaults(fn=cmd_ablate)
    return p


def main(argv=None) -> int:
    from t5lite import clock
    clock.mark_command_start(_IMPORTED_AT)
    _quiet_env()
    from t5lite.store import gcs
    gcs.configure()  # gs:// routed before any path picks its library (store/gcs.py)
    from t5lite import progress
    progress.drop_closed_event_loop_noise()  # orbax's leftovers after a fallback restore
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else 2
    # train, eval and infer import TF themselves once the config or --set is checked: a
    # config error shows in a second
    light = (args.fn in (cmd_models, cmd_convert, cmd_plot, cmd_compile, cmd_train, cmd_eval,
                         cmd_infer)
             # task_catalog: no seqio (a user's task module needs it)
             or (args.fn is cmd_tasks and args.action == "list" and not args.task_module))
    if not light:  # the others read data through seqio / TF
        _import_tensorflow_quietly()
    try:
        args.fn(args)
    except UserError as e:
        print(f"t5lite: error: {e}", file=sys.stderr)
        _exit_now_if_distributed(2)
        return 2
    except Preempted as e:  # checkpoint saved: a supervisor reruns the same command
        print(f"t5lite: {e}", file=sys.stderr)
        _exit_now_if_distributed(e.EXIT_CODE)
        return e.EXIT_CODE
    except BaseException:
        if _distributed():
            import traceback
            traceback.print_exc()
            _exit_now_if_distributed(1)
        raise
    return 0


def _distributed() -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def _exit_now_if_distributed(code: int) -> None:
    """In a multi-process job a failing process exits at once: a normal exit would wait in
    jax.distributed's shutdown barrier (minutes) for peers that are waiting on it."""
    if _distributed():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

