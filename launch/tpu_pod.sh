#!/usr/bin/env bash
# Runs bertjax pretraining on every worker of a Cloud TPU VM slice.
#
#   launch/tpu_pod.sh [--dry-run] TPU_NAME ZONE WORKDIR CONFIG [extra flags...]
#
#   launch/tpu_pod.sh my-v5e-256 us-west4-a gs://bucket/run1 configs/bert.py:large \
#       --config.mesh_shape=1,-1,1 --config.scan_layers=True
#
# Every worker gets the same checkout (git clone of REPO at REV), installs it
# with the tpu extra and starts `python -m bertjax.main --distributed`. With
# --dry-run the gcloud commands are printed, not run. A preempted run exits
# with status 75; running this script again resumes from the last checkpoint.
set -euo pipefail

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
if [[ $# -lt 4 ]]; then
  echo "usage: $0 [--dry-run] TPU_NAME ZONE WORKDIR CONFIG [extra flags...]" >&2
  exit 2
fi
tpu=$1 zone=$2 workdir=$3 config=$4
shift 4
repo=${REPO:-$(git -C "$(dirname "$0")/.." remote get-url origin 2>/dev/null || echo REPO_URL)}
rev=${REV:-$(git -C "$(dirname "$0")/.." rev-parse HEAD 2>/dev/null || echo main)}

quoted_extra=$(printf ' %q' "$@")
remote="set -e; if [ ! -d bertjax ]; then git clone $(printf %q "$repo") bertjax; fi; \
cd bertjax && git fetch -q origin && git checkout -q $(printf %q "$rev") && \
pip install -q -e '.[tpu]' && \
python -m bertjax.main --distributed --config=$(printf %q "$config") \
--workdir=$(printf %q "$workdir")${quoted_extra}"

cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="$remote")
if [[ $dry_run == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
else
  "${cmd[@]}"
fi
