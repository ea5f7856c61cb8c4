"""Before anything is rented or started: the workdir's bucket exists and an object can be
written, read and deleted there, by the identity the VMs will use when gcloud lets us act as
it (--impersonate-service-account), else by the user's, with a one-line warning."""

from __future__ import annotations

import re
import secrets
import shlex

from .gcloud import Cloud, last_lines
from .messages import LaunchError, note

IMPERSONATION_REFUSED = re.compile(r"Failed to impersonate|iam\.serviceAccounts\.getAccessToken|"
                                   r"serviceAccountTokenCreator", re.I)
NOT_FOUND = re.compile(r"\b404\b|NotFound|not found|does not exist", re.I)
DENIED = re.compile(r"\b403\b|AccessDenied|PERMISSION_DENIED|does not have", re.I)


def probe_commands(workdir: str, identity: list[str]) -> list[tuple[str, list[str], str | None]]:
    """(what, command, stdin) for a probe object written (a missing bucket fails here with
    404), read and deleted. No `buckets describe`: it needs storage.buckets.get, which an
    account that may write objects (roles/storage.objectAdmin) need not have."""
    probe = f"{workdir.rstrip('/')}/.t5lite-probe-{secrets.token_hex(4)}"
    storage = ["gcloud", "storage"]
    return [("write to", storage + ["cp", "-", probe] + identity, "t5lite write probe\n"),
            ("read from", storage + ["cat", probe] + identity, None),
            ("delete from", storage + ["rm", probe] + identity, None)]


def check_bucket(cloud: Cloud, args) -> None:
    """LaunchError with what to fix when the run could not write its checkpoints."""
    if getattr(args, "skip_bucket_check", False):
        return
    account = getattr(args, "service_account", "")
    identity = [f"--impersonate-service-account={account}"] if account else []
    if cloud.dry:
        for _, cmd, stdin in probe_commands(args.workdir, identity):
            print(shlex.join(cmd) + (" <<< " + shlex.quote(stdin.strip()) if stdin else ""))
        return
    failure = _probe(cloud, args.workdir, identity)
    if failure and identity and IMPERSONATION_REFUSED.search(failure[1]):
        note(f"cannot act as {account} (needs roles/iam.serviceAccountTokenCreator on it): "
             f"checking {args.workdir} with your own identity instead, which the VMs do not use")
        identity, failure = [], _probe(cloud, args.workdir, [])
    elif not identity:
        note(f"checked {args.workdir} with your identity; the VMs write as their service "
             "account (--service-account checks as that one)")
    if failure:
        raise LaunchError(_fix(args.workdir, account if identity else "you", *failure))


def _probe(cloud: Cloud, workdir: str, identity: list[str]) -> tuple[str, str] | None:
    """None, or (the step that failed, gcloud's message)."""
    for what, cmd, stdin in probe_commands(workdir, identity):
        rc, _, err = cloud.query(cmd, stdin=stdin)
        if rc != 0:
            return what, err
    return None


def _fix(workdir: str, who: str, what: str, err: str) -> str:
    bucket = "gs://" + workdir[len("gs://"):].split("/", 1)[0]
    if what == "write to" and NOT_FOUND.search(err) and not DENIED.search(err):
        return (f"bucket {bucket} does not exist: create it in the TPU's region (gcloud storage "
                f"buckets create {bucket} --location=REGION) or fix --workdir.")
    if DENIED.search(err):
        member = f"serviceAccount:{who}" if who != "you" else "user:YOUR_EMAIL"
        return (f"{who} cannot {what} {bucket} ({last_lines(err, 1)}): grant it "
                f"roles/storage.objectAdmin (gcloud storage buckets add-iam-policy-binding "
                f"{bucket} --member={member} --role=roles/storage.objectAdmin), or pass "
                "--skip-bucket-check.")
    return (f"checking {workdir}: could not {what} ({last_lines(err, 1)}); fix it or pass "
            "--skip-bucket-check.")
