"""The `t5lite` command's flags: counts are checked by argparse before anything heavy loads,
every option's default is said once in --help, and the run directory is --workdir in every
command (eval / infer still take their older --checkpoint)."""

import argparse
import re
import subprocess
import sys

import pytest

from t5lite.cli import main as cli


def _subparsers():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("argv, message", [
    (["eval", "--workdir", "w", "--task", "sentiment", "--max-examples", "-1"],
     "argument --max-examples: must be >= 0 (0: every example), got -1"),
    (["eval", "--workdir", "w", "--task", "sentiment", "--shots", "-2"],
     "argument --shots: must be >= 0, got -2"),
    (["eval", "--workdir", "w", "--task", "sentiment", "--max-examples", "ten"],
     "argument --max-examples: 'ten' is not an integer"),
    (["tasks", "show", "sentiment", "--num-examples", "0"],
     "argument --num-examples: must be >= 1, got 0"),
    (["ablate", "--table", "table2", "--workdir", "w", "--seeds", "0"],
     "argument --seeds: must be >= 1, got 0"),
])
def test_a_negative_count_is_refused_before_the_command_runs(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith(message), err


def test_every_default_is_said_once_in_help():
    """ArgumentDefaultsHelpFormatter appends "(default: X)"; a help text that already explains
    what its default value means ("0 = all", "0: the chip's") must not get a second one."""
    for name, sp in _subparsers().items():
        formatter = sp._get_formatter()
        for action in sp._actions:
            if action.help in (None, argparse.SUPPRESS):
                continue
            text = formatter._get_help_string(action) % {"default": action.default}
            assert len(re.findall(r"\bdefault\b", text)) <= 1, (name, action.dest, text)
            d = action.default
            if "default" in text and isinstance(d, (int, float)) and not isinstance(d, bool):
                said = {str(d), str(int(d))}  # 0.0 is also written 0
                if text.endswith(f"(default: {d})"):
                    explained = [v for v in said if re.search(
                        rf"(?<![\w.]){re.escape(v)}\s*[=:]", action.help)]
                    assert not explained, (name, action.dest, text)


def test_the_run_directory_is_workdir_in_every_command():
    commands = _subparsers()
    for name in ("train", "quickstart", "ablate", "eval", "infer"):
        flags = {s for a in commands[name]._actions for s in a.option_strings}
        assert "--workdir" in flags, name
    parser = cli.build_parser()
    for flag in ("--workdir", "--checkpoint"):  # the older spelling still works
        args = parser.parse_args(["eval", flag, "runs/x", "--task", "sentiment"])
        assert args.checkpoint == "runs/x"
        args = parser.parse_args(["infer", flag, "runs/x", "--input", "-"])
        assert args.checkpoint == "runs/x"
    assert "--workdir WORKDIR, --checkpoint WORKDIR" in commands["eval"].format_help()


def test_eval_and_infer_report_a_bad_set_before_importing_tensorflow():
    """A typo in --set is the checkpoint-independent part of the config: it is reported
    before TensorFlow loads (seconds), as `train` reports its config errors. A fresh
    interpreter, so that other tests' imports cannot hide a TensorFlow import."""
    code = r"""
import sys
from t5lite.cli import main
assert main.main(sys.argv[1:]) == 2
print("tensorflow" in sys.modules, "jax" in sys.modules)
"""
    for argv in (["eval", "--workdir", "no/such/run", "--task", "sentiment",
                  "--set", "decode.beems=2"],
                 ["eval", "--workdir", "no/such/run", "--task", "sentiment", "--shots", "2",
                  "--set", "decode.beems=2"],
                 ["infer", "--workdir", "no/such/run", "--input", "-",
                  "--set", "decode.beems=2"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["False", "False"], (argv, r.stdout)
        assert r.stderr.strip() == ("t5lite: error: unknown config key 'decode.beems'. Did you "
                                    "mean: decode.beams, decode.seed, decode.method?"), r.stderr
