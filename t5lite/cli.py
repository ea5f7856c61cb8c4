"""`t5lite`: train, compile, eval, infer, quickstart, models, tasks, data, convert, ablate.

Each subcommand parses its flags here and calls one function in the module that owns the work,
so this file stays a table of contents. Heavy imports (jax, tensorflow) happen inside the
handlers, so `t5lite --help` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from t5lite.errors import UserError


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


def _config(args):
    from t5lite import config
    return config.load_config(args.config, args.set or [])


def cmd_train(args):
    from t5lite import trainer
    cfg = _config(args)
    trainer.train(cfg, args.workdir)


def cmd_compile(args):
    from t5lite import aot
    aot.compile_command(args.config, args.topology, args.set or [], as_json=args.json,
                        do_search=args.search, hbm_gib=args.hbm_gib, decode=args.decode)


def cmd_quickstart(args):
    from t5lite import quickstart
    quickstart.run(args.workdir, fast=args.fast)


def cmd_eval(args):
    from t5lite import evaluation
    evaluation.eval_command(checkpoint=args.checkpoint, task=args.task, split=args.split,
                            max_examples=args.max_examples, overrides=args.set or [])


def cmd_infer(args):
    from t5lite import evaluation
    evaluation.infer_command(checkpoint=args.checkpoint, input_path=args.input,
                             output_path=args.output, mode=args.mode,
                             options=args.options or [], overrides=args.set or [],
                             prefix=args.prefix)


def cmd_models(args):
    from t5lite.models import param_count_table
    print(param_count_table(args.names or None))


def cmd_tasks(args):
    from t5lite.tasks import inspect
    if args.action == "list":
        print(inspect.list_tasks())
    else:
        if not args.name:
            raise UserError("`t5lite tasks show` needs a task or mixture name; "
                            "see `t5lite tasks list`.")
        print(inspect.show_task(args.name, split=args.split, num_examples=args.num_examples))


def cmd_data(args):
    from t5lite.tasks import local_data
    local_data.prepare(args.names or None, data_dir=args.data_dir or "", force=args.force)


def cmd_convert(args):
    from t5lite import convert
    if args.direction == "import":
        convert.import_hf_command(args.src, args.dst)
    else:
        convert.export_hf_command(args.src, args.dst)


def cmd_ablate(args):
    from t5lite import ablations
    if args.list:
        print(ablations.list_tables())
        return
    if not args.table or not args.workdir:
        raise UserError("`t5lite ablate` needs --table NAME and --workdir DIR (or --list).")
    def names(values):  # "--rows a b" and "--rows a,b" both work
        return [n for v in values or () for n in v.split(",") if n]

    ablations.run(args.table, args.workdir, rows=names(args.rows), tasks=names(args.tasks),
                  scale=args.scale, overrides=args.set or [], dry_run=args.dry_run)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t5lite", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def add_config(sp):
        sp.add_argument("--config", required=True,
                        help="configs/NAME.py, a path, or a bare config name")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config field, e.g. --set train.steps=100 (repeatable)")

    sp = sub.add_parser("train", help="pretrain or finetune from a config")
    add_config(sp)
    sp.add_argument("--workdir", required=True, help="checkpoints, logs (local path or gs://)")
    sp.set_defaults(fn=cmd_train)

    sp = sub.add_parser("compile", help="compile the train step for a TPU slice on this host "
                        "(needs libtpu, no TPU): fits in HBM? est. step time and MFU")
    add_config(sp)
    sp.add_argument("--topology", required=True,
                    help="gcloud accelerator type (v4-8, v5p-32, v5litepod-16, v6e-8) or JAX "
                         "topology name (v5p:2x2x4)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--search", action="store_true",
                    help="try (data, fsdp, tensor) meshes, remat policies and micro-batch "
                         "counts; rank those that fit by estimated step time")
    sp.add_argument("--hbm-gib", type=float, default=0.0,
                    help="HBM per chip to fit into (default: the chip's; lower it for headroom)")
    sp.add_argument("--decode", action="store_true",
                    help="compile the decoding program (cfg.decode: method, beams, max_length) "
                         "instead of the train step")
    sp.set_defaults(fn=cmd_compile)

    sp = sub.add_parser("quickstart",
                        help="prepare local data, pretrain a tiny T5, finetune it on sentiment")
    sp.add_argument("--workdir", default="runs/quickstart")
    sp.add_argument("--fast", action="store_true", help="fewer steps (smoke test)")
    sp.set_defaults(fn=cmd_quickstart)

    sp = sub.add_parser("eval", help="evaluate a checkpoint on a task with its metrics")
    sp.add_argument("--checkpoint", required=True, help="a workdir or checkpoint step dir")
    sp.add_argument("--task", required=True)
    sp.add_argument("--split", default="validation")
    sp.add_argument("--max-examples", type=int, default=0)
    sp.add_argument("--set", action="append", metavar="KEY=VALUE")
    sp.set_defaults(fn=cmd_eval)

    sp = sub.add_parser("infer", help="write JSONL predictions for input lines")
    sp.add_argument("--checkpoint", required=True)
    sp.add_argument("--input", required=True, help="text file, one input per line, or -")
    sp.add_argument("--output", default="-", help="JSONL file or - for stdout")
    sp.add_argument("--mode", default="predict", choices=["predict", "score", "rank"])
    sp.add_argument("--options", action="append",
                    help="rank mode: a candidate target (repeatable)")
    sp.add_argument("--prefix", default="",
                    help="the task's text-to-text prefix, put before every input line, e.g. "
                         "'sst2 sentence:' (`t5lite tasks show NAME` shows a task's inputs)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="decoding options, e.g. decode.method=beam decode.beams=4")
    sp.set_defaults(fn=cmd_infer)

    sp = sub.add_parser("models", help="print each model config's parameter count")
    sp.add_argument("names", nargs="*", help="config names (default: all model configs)")
    sp.set_defaults(fn=cmd_models)

    sp = sub.add_parser("tasks", help="list tasks / show preprocessed examples")
    sp.add_argument("action", choices=["list", "show"])
    sp.add_argument("name", nargs="?")
    sp.add_argument("--split", default="train")
    sp.add_argument("--num-examples", type=int, default=3)
    sp.set_defaults(fn=cmd_tasks)

    sp = sub.add_parser("data", help="fetch and build local corpora, finetuning sets, vocabs")
    sp.add_argument("action", choices=["prepare"])
    sp.add_argument("names", nargs="*", help="datasets to build (default: all)")
    sp.add_argument("--data-dir", default="")
    sp.add_argument("--force", action="store_true")
    sp.set_defaults(fn=cmd_data)

    sp = sub.add_parser("convert", help="import/export Hugging Face T5, BERT, GPT-2 weights")
    sp.add_argument("direction", choices=["import", "export"])
    sp.add_argument("src", help="import: local HF dir; export: t5lite checkpoint dir")
    sp.add_argument("dst", help="import: t5lite checkpoint dir; export: HF dir")
    sp.set_defaults(fn=cmd_convert)

    sp = sub.add_parser("ablate", help="reproduce a T5 paper ablation table (configs/ablations/)")
    sp.add_argument("--table", help="e.g. table6 (see --list)")
    sp.add_argument("--workdir", help="runs in WORKDIR/<table>/<row>/, WORKDIR/<table>/table.md")
    sp.add_argument("--rows", nargs="+", help="run only these rows, space- or comma-separated "
                    "(default: all)")
    sp.add_argument("--tasks", nargs="+", help="downstream tasks, space- or comma-separated "
                    "(default: the table's)")
    sp.add_argument("--scale", default="tiny",
                    help="tiny (CPU, default) or paper (T5 base, 2^18 steps)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override for every row and stage (repeatable); "
                    "pretrain.KEY=V / finetune.KEY=V: one stage only")
    sp.add_argument("--dry-run", action="store_true",
                    help="print the `t5lite train` / `t5lite eval` commands, train nothing")
    sp.add_argument("--list", action="store_true", help="list the tables and their rows")
    sp.set_defaults(fn=cmd_ablate)
    return p


def main(argv=None) -> int:
    _quiet_env()
    args = build_parser().parse_args(argv)
    if args.fn not in (cmd_models, cmd_convert, cmd_compile):  # others read data via seqio / TF
        _import_tensorflow_quietly()
    try:
        args.fn(args)
    except UserError as e:
        print(f"t5lite: error: {e}", file=sys.stderr)
        _exit_now_if_distributed(2)
        return 2
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


if __name__ == "__main__":
    sys.exit(main())
