#!/bin/bash
# The training job on one TPU VM worker; launch/tpu_vm.py runs it on every worker over ssh.
#
#   bash launch/tpu_job.sh run [--detach] [--job-id ID] [--env-file F] [--logs-url gs://..]
#                              [--sync-every S] -- CMD...
#   bash launch/tpu_job.sh stop [--grace S]      # SIGTERM (the trainer saves and exits 75), then KILL
#   bash launch/tpu_job.sh status
#   bash launch/tpu_job.sh sync-logs             # copy this worker's logs to --logs-url now
#
# `run` is idempotent: when this worker already runs the same CMD (a rerun, or gcloud re-running
# the ssh command after a dropped connection) it attaches to that job instead of starting a
# second one; a different CMD is refused. A `run` re-sent with the --job-id of a job that has
# already ended reports that job's exit instead of running it again. Before a new start it
# ends stale jobs left by earlier runs and removes a stale libtpu lockfile (as MaxText does),
# so the TPU is free. Logs are
# appended per job (never truncated) and copied to LOGS_URL/<job id>/worker-<N>.log every
# --sync-every seconds and when the job ends, so they outlive the VM.
# --env-file F (`export NAME=VALUE` lines that tpu_vm.py copied here for --env) is moved into
# JOB_HOME, readable only by this user, and sourced by the job: its values, which may be
# secrets, never appear on a command line, in `ps`, in the log or in its copies (the names do).
# `stop` marks the job stopped, so that its exit (75, like a preemption) reads as a stop.
# Every outcome ends with one line `t5lite-job: worker N <what>` that tpu_vm.py reads.

set -u
JOB_HOME="${T5LITE_JOB_HOME:-$HOME/t5lite-job}"  # pid, cmd, exit, logs of this worker's job
LOCKFILE="${T5LITE_TPU_LOCKFILE:-/tmp/libtpu_lockfile}"  # libtpu's one-process lock
PIDF="$JOB_HOME/pid" CMDF="$JOB_HOME/cmd" EXITF="$JOB_HOME/exit" URLF="$JOB_HOME/logs_url"
IDF="$JOB_HOME/job_id"  # the id of the job that EXITF belongs to
STOPF="$JOB_HOME/stopped"  # the id of the job that `stop` stopped
ENVF="$JOB_HOME/env"  # the current job's --env values (mode 600)
CURRENT_LOG="$HOME/t5lite-train.log"  # symlink to the current job's log (`logs` reads it)
# A worker's data is copied in from the launching machine (building it needs npm, apt lists and
# pip in the venv, which TPU images lack): t5lite then names this command for missing data.
export T5LITE_DATA_FROM="${T5LITE_DATA_FROM-python launch/tpu_vm.py data TPU_NAME}"
mkdir -p "$JOB_HOME/logs"

worker_id() {
    if [[ -n "${T5LITE_WORKER:-}" ]]; then echo "$T5LITE_WORKER"; return; fi
    curl -sf -m 5 -H "Metadata-Flavor: Google" \
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number" \
        2>/dev/null || hostname
}
W="$(worker_id)"
say() { echo "t5lite-job: worker $W $*"; }

# Running and not a zombie (in a container without an init, nobody may reap the job).
alive() { kill -0 "$1" 2>/dev/null && ! grep -qE '^[0-9]+ \(.*\) [ZX]' "/proc/$1/stat" 2>/dev/null; }

# The pid of this worker's live job wrapper, or nothing (a stale pid file is ignored).
live_pid() {
    local pid
    pid="$(cat "$PIDF" 2>/dev/null)" || return 0
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if alive "$pid" && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null \
        | grep -q "tpu_job.sh _wrap"; then
        echo "$pid"
    fi
}

sync_logs() {
    local url log
    url="$(cat "$URLF" 2>/dev/null)" || return 0
    log="$(readlink -f "$CURRENT_LOG" 2>/dev/null)" || return 0
    [[ -n "$url" && -f "$log" ]] || return 0
    gcloud storage cp "$log" "$url/$(basename "$log" .log)/worker-$W.log" >/dev/null 2>&1
}

# Processes of earlier jobs of this worker (they carry T5LITE_JOB_HOME in their environment),
# and, on a TPU VM, anything of ours still holding the TPU devices.
stale_pids() {
    local p pid
    # one grep over every environ (NUL-separated entries), not two processes per process
    for p in $(grep -lzxF "T5LITE_JOB_HOME=$JOB_HOME" /proc/[0-9]*/environ 2>/dev/null); do
        pid="${p#/proc/}"; pid="${pid%/environ}"
        [[ "$pid" == "$$" ]] || echo "$pid"
    done
    if command -v lsof >/dev/null 2>&1; then
        lsof -t /dev/accel* /dev/vfio/[0-9]* 2>/dev/null || true
    fi
}

clean_stale() {
    local pids pid
    pids="$(stale_pids | sort -u)"
    for pid in $pids; do
        say "ending stale process $pid: $({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)"
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in $pids; do  # up to 5 s each to exit, then KILL
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
    done
    if [[ -e "$LOCKFILE" ]]; then
        say "removing stale $LOCKFILE"
        rm -f "$LOCKFILE" 2>/dev/null || sudo -n rm -f "$LOCKFILE" 2>/dev/null || true
    fi
}

# Follow the log from byte `from` until the job ends, then report its exit code (the wrapper
# writes it). Liveness is checked before each read, so the last read has the last lines.
attach() {
    local pid="$1" pos="$2" size running=1
    while (( running )); do
        alive "$pid" || running=0
        size="$(stat -L -c %s "$CURRENT_LOG" 2>/dev/null || echo 0)"
        if (( size >= pos )); then
            tail -c "+$pos" "$CURRENT_LOG" 2>/dev/null | head -c "$(( size - pos + 1 ))"
            pos=$(( size + 1 ))
        fi
        (( running )) && sleep 0.2
    done
    report_exit
}

# The ended job's exit code (the wrapper writes it), as the last line tpu_vm.py reads.
report_exit() {
    local rc
    rc="$(cat "$EXITF" 2>/dev/null)"
    if [[ -z "$rc" ]]; then say "lost (the job ended without an exit code)"; exit 1; fi
    if [[ -s "$STOPF" && "$(cat "$STOPF")" == "$(cat "$IDF" 2>/dev/null)" ]]; then
        say "exit $rc stopped"
    else
        say "exit $rc"
    fi
    exit "$rc"
}

cmd_run() {
    local detach=0 job_id="" url="" every=60 env_file=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --detach) detach=1 ;;
            --job-id) job_id="$2"; shift ;;
            --env-file) env_file="$2"; shift ;;
            --logs-url) url="$2"; shift ;;
            --sync-every) every="$2"; shift ;;
            --) shift; break ;;
            *) echo "tpu_job.sh: unknown option $1" >&2; exit 2 ;;
        esac
        shift
    done
    [[ $# -gt 0 ]] || { echo "tpu_job.sh: give the command after --" >&2; exit 2; }
    local cmd pid
    cmd="$(printf '%q ' "$@")"
    if [[ -n "$env_file" ]]; then  # the names (not the values) are part of what the job is
        chmod 600 "$env_file" 2>/dev/null
        [[ -f "$env_file" ]] || env_file="$ENVF.$job_id"  # gcloud re-sent the command
        [[ -f "$env_file" ]] || { say "lost (no --env file $env_file)"; exit 1; }
        cmd+="(env file: $(sed -n 's/^export \([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$env_file" \
            | tr '\n' ' '))"
    fi
    # not started by this `run` (attached, refused, already ended): its copy goes
    [[ -n "$env_file" && "$env_file" != "$ENVF.$job_id" ]] && trap 'rm -f "$env_file"' EXIT
    # One `run` at a time decides (a rerun racing a re-sent ssh command must not start two jobs).
    exec 9>"$JOB_HOME/run.lock"
    flock -w 120 9 || true
    pid="$(live_pid)"
    if [[ -n "$pid" ]]; then
        exec 9>&-
        if [[ "$(cat "$CMDF" 2>/dev/null)" != "$cmd" ]]; then
            say "refused: another job is running (pid $pid: $(cat "$CMDF")); stop it first" \
                "(tpu_vm.py stop-job)"
            exit 3
        fi
        say "attached to the running job (pid $pid)"
        [[ $detach == 1 ]] && exit 0
        local size recent  # show the last 20 lines, then follow
        size="$(stat -L -c %s "$CURRENT_LOG" 2>/dev/null || echo 0)"
        recent="$(tail -n 20 "$CURRENT_LOG" 2>/dev/null | wc -c)"
        attach "$pid" "$(( size - recent + 1 ))"
    fi
    # tpu_vm.py gives every `train` its own id, so the same id again is gcloud re-sending the
    # command of a connection that dropped as the job ended: report, never run a job twice.
    if [[ -n "$job_id" && -f "$EXITF" && "$(cat "$IDF" 2>/dev/null)" == "$job_id" ]]; then
        exec 9>&-
        say "job $job_id has already ended; its last lines:"
        tail -n 20 "$JOB_HOME/logs/$job_id.log" 2>/dev/null
        report_exit
    fi
    clean_stale
    job_id="${job_id:-$(date -u +%Y%m%dT%H%M%SZ)}"
    local log="$JOB_HOME/logs/$job_id.log"
    rm -f "$EXITF" "$PIDF" "$STOPF"
    find "$JOB_HOME" -maxdepth 1 -name 'env.*' ! -name "env.$job_id" -delete 2>/dev/null
    if [[ -n "$env_file" && "$env_file" != "$ENVF.$job_id" ]]; then
        mv -f "$env_file" "$ENVF.$job_id" && trap - EXIT
        env_file="$ENVF.$job_id"
    fi
    printf '%s' "$job_id" >"$IDF"
    printf '%s' "$cmd" >"$CMDF"
    printf '%s' "$url" >"$URLF"
    local from=$(( $(stat -c %s "$log" 2>/dev/null || echo 0) + 1 ))
    echo "=== t5lite job $job_id on worker $W, $(date -u '+%F %T') UTC: $cmd" >>"$log"
    ln -sfn "$log" "$CURRENT_LOG"
    # setsid: the job is its own process group (stop-job signals all of it) and survives the
    # ssh session; stdin from /dev/null so a dropped connection cannot stop it; started from a
    # subshell so that init, not this shell, reaps it.
    (T5LITE_SYNC_EVERY="$every" T5LITE_ENV_FILE="$env_file" setsid env \
        T5LITE_JOB_HOME="$JOB_HOME" bash "${BASH_SOURCE[0]}" _wrap "$@" >>"$log" 2>&1 \
        </dev/null 9>&- &)
    for _ in $(seq 100); do [[ -s "$PIDF" || -f "$EXITF" ]] && break; sleep 0.1; done
    exec 9>&-
    pid="$(cat "$PIDF" 2>/dev/null)"
    if [[ -z "$pid" && -f "$EXITF" ]]; then  # it ended before we looked (a quick failure)
        say "started job $job_id"
        tail -c "+$from" "$log"
        report_exit
    fi
    [[ -n "$pid" ]] || { say "lost (the job did not start; see $log)"; exit 1; }
    say "started job $job_id (pid $pid)"
    [[ $detach == 1 ]] && exit 0
    attach "$pid" "$from"
}

# Runs inside the job's process group: the command, its exit code, the log copies.
cmd_wrap() {
    echo $$ >"$PIDF.tmp" && mv "$PIDF.tmp" "$PIDF"
    # in the checkout this script came with: --config=configs/... is a path inside it, and in
    # the home above it ~/t5lite (no __init__.py) shadows the venv's editable t5lite package
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
    (while sleep "${T5LITE_SYNC_EVERY:-60}"; do sync_logs; done) 2>/dev/null &
    local syncer=$!
    trap : TERM INT HUP  # outlive the signal: the trainer saves a checkpoint, we record its exit
    if [[ -n "${T5LITE_ENV_FILE:-}" ]]; then
        # shellcheck disable=SC1090
        . "$T5LITE_ENV_FILE" || { echo "=== cannot read the --env file"; exit 1; }
        unset T5LITE_ENV_FILE
    fi
    "$@"
    local rc=$?
    echo "=== exit $rc, $(date -u '+%F %T') UTC"
    echo "$rc" >"$EXITF.tmp" && mv "$EXITF.tmp" "$EXITF"
    pkill -P "$syncer" 2>/dev/null; kill "$syncer" 2>/dev/null; wait "$syncer" 2>/dev/null
    sync_logs
    rm -f "$PIDF"
    exit "$rc"
}

cmd_stop() {
    local grace=180 pid
    [[ "${1:-}" == "--grace" ]] && grace="$2"
    pid="$(live_pid)"
    if [[ -z "$pid" ]]; then say "no job running"; exit 0; fi
    cp "$IDF" "$STOPF" 2>/dev/null
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in $(seq $((grace * 10))); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
        say "did not stop within ${grace}s: killing it"
        kill -KILL -- "-$pid" 2>/dev/null
        sync_logs
    fi
    say "stopped (exit $(cat "$EXITF" 2>/dev/null || echo killed))"
}

cmd_status() {
    local pid
    pid="$(live_pid)"
    if [[ -n "$pid" ]]; then say "running (pid $pid): $(cat "$CMDF")"
    elif [[ -f "$EXITF" ]]; then say "finished (exit $(cat "$EXITF"))"
    else say "no job"; fi
}

case "${1:-}" in
    run) shift; cmd_run "$@" ;;
    _wrap) shift; cmd_wrap "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    status) cmd_status ;;
    sync-logs) sync_logs; say "logs copied to $(cat "$URLF" 2>/dev/null)" ;;
    *) echo "usage: tpu_job.sh run|stop|status|sync-logs ..." >&2; exit 2 ;;
esac
