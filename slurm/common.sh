# Shared by the sbatch scripts in this folder. Source it; do not run it.
#   DRY_RUN=1   print the rendered job (environment and commands) instead of running it
#   REPO        the nvfp4train checkout (default: the folder above this one)
#   VENV        a virtualenv to activate (optional)
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$REPO"
if [[ -n ${VENV:-} && -z ${DRY_RUN:-} ]]; then source "$VENV/bin/activate"; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export MASTER_PORT=${MASTER_PORT:-$((29500 + ${SLURM_JOB_ID:-0} % 1000))}
if [[ -z ${MASTER_ADDR:-} ]]; then
  MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n 1 || true)
  if [[ -z $MASTER_ADDR ]]; then  # no scontrol: first host of "node[01-04],..." by hand
    first=${SLURM_JOB_NODELIST:-localhost}; first=${first%%,*}
    if [[ $first =~ ^([^[]+)\[([0-9]+) ]]; then first=${BASH_REMATCH[1]}${BASH_REMATCH[2]}; fi
    MASTER_ADDR=$first
  fi
  export MASTER_ADDR
fi

# Run a command, or print it under DRY_RUN. Preemption: SLURM sends SIGUSR1 to this batch shell
# (#SBATCH --signal=B:USR1@180); we pass SIGTERM to the training step, whose ranks save a
# checkpoint and exit; then the job is requeued and resumes from it (train.resume=auto).
# torchrun exits non-zero after a SIGTERM even when every rank saved and exited cleanly, so its
# status must not reach `set -e` before the requeue: a USR1 always ends in `scontrol requeue` and
# exit 0 (the requeued job is the continuation; SLURM marks a non-zero exit FAILED).
launch() {
  if [[ -n ${DRY_RUN:-} ]]; then
    echo "# job ${SLURM_JOB_ID:-<id>} on ${SLURM_JOB_NODELIST:-<nodes>} (MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT)"
    printf '%q ' "$@"; echo
    return 0
  fi
  "$@" &
  TRAIN_PID=$!
  trap requeue_after_checkpoint USR1
  local status=0
  wait "$TRAIN_PID" || status=$?
  trap - USR1
  return "$status"
}

requeue_after_checkpoint() {
  trap '' USR1  # a second signal while the checkpoint is written changes nothing
  echo "preemption signal: checkpointing (SIGTERM to pid $TRAIN_PID)"
  kill -TERM "$TRAIN_PID" 2>/dev/null || true
  local status=0
  wait "$TRAIN_PID" || status=$?
  echo "training step exited with status $status; requeueing job ${SLURM_JOB_ID:-?}"
  scontrol requeue "${SLURM_JOB_ID:?SLURM_JOB_ID is not set: cannot requeue}"
  exit 0
}
