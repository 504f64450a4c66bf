#!/usr/bin/env bash
# A queue of difftune trainings, with nothing but bash and `accelerate launch`.
# See docs/batch-runs.md for the exit codes and the run summary this script reads.
#
#   examples/queue.sh JOBS_FILE
#
# JOBS_FILE has one training per line ("#" starts a comment; no spaces inside a field):
#
#   # GPUS  CONFIG               OUTPUT_DIR  OUTPUT_NAME  [more train_network.py arguments]
#   0,1     configs/style.toml   output      style-a
#   0,1     configs/style.toml   output      style-b      --learning_rate 5e-5
#   2,3     configs/person.toml  output      person-c
#   4       configs/person.toml  output      person-d     --max_train_steps 800
#
# Trainings with the same GPU set run one after another, in file order; different GPU sets run
# at the same time. Above: style-a then style-b on GPUs 0 and 1 (2 processes each), person-c on
# GPUs 2 and 3 and person-d on GPU 4, all three sets at once. Give every training its own
# OUTPUT_NAME: the name is what a run locks, and where its summary is found
# (OUTPUT_DIR/OUTPUT_NAME-summary.json). Each training's console goes to OUTPUT_DIR/OUTPUT_NAME.log.
#
# After a training, its summary says what happened (accelerate launch itself exits with 1 for
# every failure, so its exit code cannot tell them apart):
#   finished                       the next training of its GPU set starts
#   failed, exit code 2            bad input (config, data, model, state): the next one starts
#   refused (no new summary)       rejected before it started (config error, name in use): next
#   failed, exit code 1            training failed (non-finite loss, failed save): the next one
#                                  starts, or with ON_FAILURE=stop its GPU set stops
#   stopped, exit code 130 or 143  someone stopped it: its GPU set stops
#   running, but no process        killed by the OS (out of memory, kill -9): its GPU set stops
#
# Running the queue again continues it: finished trainings are skipped; stopped and killed ones
# resume from the state their summary names ("resume_with"); failed ones are skipped, or, with
# RETRY_FAILED=1, resumed from their last state (started anew when they have none).
#
# Ctrl-C (or SIGTERM) on the queue stops every running training at its next optimizer step, with
# a state saved, starts no new one, and waits for them to end. The queue sends the stop to each
# training's main process itself (the "pid" in its summary), once: trainings run in process
# groups of their own, so the terminal's Ctrl-C does not reach them a second time (a second
# Ctrl-C stops a training without saving). Under accelerate's multi-GPU launcher the main process
# passes the stop on to the others at the next step.
#
# Environment:
#   LAUNCH        the launcher (default "accelerate launch"; the tests use "python"). For
#                 accelerate, the GPU count becomes --num_processes (and --multi_gpu); for torchrun
#                 ("torchrun" or "python -m torch.distributed.run") --nproc_per_node; any other
#                 launcher gets no process count (one process)
#   TRAIN         the training script (default: train_network.py beside this folder)
#   PYTHON        the Python that reads the summaries (default: python)
#   ON_FAILURE    continue (default) or stop: what a failed training (exit code 1) does to its set
#   RETRY_FAILED  1: resume (or restart) trainings whose summary says failed
#   POLL          seconds between checks of the running trainings (default 5)
#
# Exit code: 0 when every training has finished; 130 (Ctrl-C) or 143 (SIGTERM) when the queue
# was stopped; 1 when a training failed, was refused or was killed.

set -u
set -m # job control: every launch gets a process group of its own (see Ctrl-C above)

LAUNCH=${LAUNCH:-accelerate launch}
TRAIN=${TRAIN:-$(cd "$(dirname "$0")/.." && pwd)/train_network.py}
PYTHON=${PYTHON:-python}
ON_FAILURE=${ON_FAILURE:-continue}
RETRY_FAILED=${RETRY_FAILED:-0}
POLL=${POLL:-5}

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "usage: $0 JOBS_FILE   (see the comments at the top of $0)" >&2
    exit 2
fi

say() { echo "queue: $*"; }

# summary_get FILE KEY...: the keys' values on one line, separated by tabs ("-" for a missing
# file, key or null value). The summary is JSON; Python reads it, so paths may hold any character.
summary_get() {
    "$PYTHON" - "$@" <<'EOF'
import json, sys
try:
    with open(sys.argv[1], encoding="utf-8") as file:
        summary = json.load(file)
except (OSError, ValueError):
    summary = {}
values = [summary.get(key) for key in sys.argv[2:]]
print("\t".join("-" if v is None or v == "" else str(v) for v in values))
EOF
}

# alive PID HOST: the process runs here (a summary's pid on another host cannot be checked)
alive() { [ "$1" != "-" ] && [ "$2" = "${HOSTNAME:-$(hostname)}" ] && kill -0 "$1" 2>/dev/null; }

# launcher_args GPUS: how many processes the launcher starts, one per GPU of the set
launcher_args() {
    local count
    count=$(echo "$1" | tr ',' '\n' | grep -c .)
    case "$LAUNCH" in
        *accelerate*) if [ "$count" -gt 1 ]; then echo "--multi_gpu --num_processes $count"; else echo "--num_processes 1"; fi ;;
        *torchrun* | *torch.distributed.run*) echo "--nproc_per_node $count" ;;
        *) ;;
    esac
}

# --- read the jobs ---------------------------------------------------------------------------
CONFIG=() OUTDIR=() NAME=() EXTRA=() RESULT=()
LANES=()                   # the GPU sets, in order of first appearance
declare -A LANE_JOBS=()    # GPU set -> its job numbers, in file order
while read -r gpus config outdir name extra; do
    case "$gpus" in "" | "#"*) continue ;; esac
    if [ -z "$name" ]; then
        echo "queue: a job needs GPUS CONFIG OUTPUT_DIR OUTPUT_NAME: '$gpus $config $outdir'" >&2
        exit 2
    fi
    i=${#NAME[@]}
    CONFIG[i]=$config OUTDIR[i]=$outdir NAME[i]=$name EXTRA[i]=$extra RESULT[i]="not started"
    [ -n "${LANE_JOBS[$gpus]+set}" ] || LANES+=("$gpus")
    LANE_JOBS[$gpus]="${LANE_JOBS[$gpus]:-} $i"
done <"$1"

# --- state of each GPU set -------------------------------------------------------------------
declare -A JOB=()      # GPU set -> the job running on it now ("" when none)
declare -A LAUNCHER=() # GPU set -> the launcher's pid
declare -A RC=()       # GPU set -> the launcher's exit code, once it has ended
declare -A BEFORE=()   # GPU set -> the summary's "started_at pid" before the launch
declare -A SENT=()     # GPU set -> 1 once the stop was sent to the running training
declare -A CLOSED=()   # GPU set -> 1 when it starts nothing more
STOP="" # the signal the queue was stopped with (INT or TERM)

summary_of() { echo "${OUTDIR[$1]}/${NAME[$1]}-summary.json"; }

# send_stop GPUS: pass the queue's stop to the training on that set, once it has said who it is
send_stop() {
    local lane=$1 i=${JOB[$1]} started pid host status
    [ -n "$i" ] && [ -z "${SENT[$lane]:-}" ] || return 0
    IFS=$'\t' read -r started pid host status < <(summary_get "$(summary_of "$i")" started_at pid host status)
    # its summary is not written yet (still reading the config and data): try again at the next poll
    [ "$started $pid" != "${BEFORE[$lane]}" ] && [ "$status" = running ] || return 0
    alive "$pid" "$host" && kill -INT "$pid" 2>/dev/null
    SENT[$lane]=1
    say "${NAME[$i]}: stop sent to pid $pid"
}

on_signal() {
    STOP=$1
    say "stopping (SIG$1): the running trainings save a state and stop; nothing new starts"
    for lane in "${LANES[@]}"; do send_stop "$lane"; done
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

# start_next GPUS: start the set's next job that has something to do; close the set when none is left
start_next() {
    local lane=$1 i status code resume_with pid host resume started
    for i in ${LANE_JOBS[$lane]}; do
        [ "${RESULT[i]}" = "not started" ] || continue
        IFS=$'\t' read -r status code resume_with pid host < <(summary_get "$(summary_of "$i")" status exit_code resume_with pid host)
        resume=""
        case "$status" in
            finished) RESULT[i]="finished (before)"; say "${NAME[i]}: finished before, skipped"; continue ;;
            running)
                if alive "$pid" "$host"; then
                    RESULT[i]="skipped: already running (pid $pid)"; say "${NAME[i]}: ${RESULT[i]}"; continue
                fi
                resume=$resume_with ;; # killed by the OS: go on from its last state
            stopped) resume=$resume_with ;;
            failed)
                if [ "$RETRY_FAILED" != 1 ]; then
                    RESULT[i]="failed before (exit code $code), skipped"; say "${NAME[i]}: ${RESULT[i]}"; continue
                fi
                resume=$resume_with ;;
        esac
        local args=(--config "${CONFIG[i]}" --output_dir "${OUTDIR[i]}" --output_name "${NAME[i]}")
        [ "$resume" = "-" ] || [ -z "$resume" ] || args+=(--resume "$resume")
        IFS=$'\t' read -r started pid < <(summary_get "$(summary_of "$i")" started_at pid)
        BEFORE[$lane]="$started $pid"
        mkdir -p "${OUTDIR[i]}"
        # $LAUNCH, its process count and EXTRA are split into words on purpose
        # shellcheck disable=SC2046,SC2086
        CUDA_VISIBLE_DEVICES=$lane $LAUNCH $(launcher_args "$lane") "$TRAIN" "${args[@]}" ${EXTRA[i]} \
            </dev/null >>"${OUTDIR[i]}/${NAME[i]}.log" 2>&1 &
        LAUNCHER[$lane]=$! JOB[$lane]=$i SENT[$lane]="" RC[$lane]=""
        RESULT[i]="running"
        say "${NAME[i]}: started on GPUs $lane${resume:+, resuming $resume} (log: ${OUTDIR[i]}/${NAME[i]}.log)"
        return
    done
    CLOSED[$lane]=1
}

# finish GPUS: the launcher has ended: wait for the training itself, read its summary, decide
finish() {
    local lane=$1 i=${JOB[$1]} rc started pid host status code reason
    if [ -z "${RC[$lane]}" ]; then
        wait "${LAUNCHER[$lane]}"
        RC[$lane]=$?
    fi
    rc=${RC[$lane]}
    IFS=$'\t' read -r started pid host status code reason < <(summary_get "$(summary_of "$i")" started_at pid host status exit_code exit_reason)
    if [ "$started $pid" = "${BEFORE[$lane]}" ]; then
        status=refused code=$rc # no summary of its own: it stopped before taking its output name
    elif [ "$status" = running ] && alive "$pid" "$host"; then
        return 1 # the launcher left before the training did (it saves its state): wait for it
    elif [ "$status" = running ]; then
        status=killed code=$rc
    fi
    JOB[$lane]=""
    RESULT[i]="$status (exit code $code)"
    [ "$reason" != "-" ] || reason=""
    say "${NAME[i]}: ${RESULT[i]}${reason:+: $reason}"
    case "$status" in
        finished | refused) ;;
        failed) [ "$code" = 2 ] || [ "$ON_FAILURE" != stop ] || CLOSED[$lane]=1 ;;
        *) CLOSED[$lane]=1 ;; # stopped or killed: someone wanted it to end; resume on the next queue run
    esac
}

# --- run -------------------------------------------------------------------------------------
while :; do
    busy=0
    for lane in "${LANES[@]}"; do
        if [ -n "${JOB[$lane]:-}" ]; then
            [ -z "$STOP" ] || send_stop "$lane"
            if kill -0 "${LAUNCHER[$lane]}" 2>/dev/null || ! finish "$lane"; then
                busy=1 # still training (or still saving after its launcher left)
                continue
            fi
        fi
        if [ -z "$STOP" ] && [ -z "${CLOSED[$lane]:-}" ]; then
            start_next "$lane"
            [ -z "${JOB[$lane]:-}" ] || busy=1
        fi
    done
    [ "$busy" = 1 ] || break
    sleep "$POLL" &
    wait $! # returns at once when a signal arrives (sleep alone would delay the trap)
done

all_finished=1
for i in "${!NAME[@]}"; do
    say "$(printf '%-24s %s' "${NAME[i]}" "${RESULT[i]}")"
    case "${RESULT[i]}" in finished*) ;; *) all_finished=0 ;; esac
done
if [ -n "$STOP" ]; then
    [ "$STOP" = INT ] && exit 130
    exit 143
fi
[ "$all_finished" = 1 ] && exit 0
exit 1
