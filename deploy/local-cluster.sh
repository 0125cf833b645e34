#!/usr/bin/env bash
# Start a Dask scheduler and N worker processes on 127.0.0.1 for local multi-process runs:
#   deploy/local-cluster.sh 2 8786        # 2 workers, scheduler on tcp://127.0.0.1:8786
#   hashdist evaluate data.zarr --out report --address tcp://127.0.0.1:8786
# Ctrl-C (or killing this script) stops all of them. Everything binds to loopback only.
# Task runs on these workers report to the Prefect API of the run that submitted them: the CLI's temporary
# server, which ends with the command (the workers may then log failed attempts to send it their last events
# and logs; harmless), or the server PREFECT_API_URL names, which keeps those records.
set -euo pipefail
workers=${1:-2}
port=${2:-8786}
threads=${THREADS_PER_WORKER:-1}
bin=$(dirname "$(command -v dask || echo ./.venv/bin/dask)")
if [ ! -x "$bin/dask" ]; then
  echo "local-cluster.sh: no dask command on PATH or in ./.venv/bin (run it from the repository root after the install)" >&2
  exit 2
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT INT TERM
# --dashboard-address: the HTTP server that runs even with --no-dashboard, on loopback too
"$bin/dask" scheduler --host 127.0.0.1 --port "$port" --no-dashboard --dashboard-address 127.0.0.1:0 &
pids+=($!)
for _ in $(seq 1 "$workers"); do
  "$bin/dask" worker "tcp://127.0.0.1:$port" --host 127.0.0.1 --nthreads "$threads" --no-dashboard \
    --dashboard-address 127.0.0.1:0 &
  pids+=($!)
done
echo "scheduler tcp://127.0.0.1:$port with $workers workers x $threads threads; Ctrl-C to stop" >&2
wait
