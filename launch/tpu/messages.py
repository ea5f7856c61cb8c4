"""What the launcher says to the user: its two error kinds, notes on stderr, and the command
line to type next."""

from __future__ import annotations

import sys


class LaunchError(Exception):
    """A mistake in the launcher's arguments or local setup; the message says what to do (exit 2).

    (Not t5lite.errors.UserError: this script runs where t5lite may not be installed.)
    """


class CloudError(Exception):
    """The cloud said no (a failed queued resource, a timeout): exit 1 with gcloud's reason."""


def note(msg: str) -> None:
    print(f"tpu_vm.py: {msg}", file=sys.stderr, flush=True)


def where_text(args) -> str:
    return " ".join(f"--{k}={getattr(args, k)}" for k in ("zone", "project") if getattr(args, k))


def verb_line(args, verb: str) -> str:
    """The launcher command that runs `verb` on the same TPU (for "next, type ..." notes)."""
    return f"python launch/tpu_vm.py {verb} {args.name} {where_text(args)}".rstrip()
