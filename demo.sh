#!/usr/bin/env bash
# The main job: on a Debian machine, as root, install what slurm-tpu needs
# (scripts/setup.sh: apt packages and .venv), then start a local demo cluster
# (controller + 4 nodes with simulated Edge TPUs and a GPU, real Slurm daemons),
# run the seeds' experiment and a batch job with the scripts in jobs/, print the
# timeline from Slurm's records, and leave the cluster running.
#   ./demo.sh            run (re-running reuses or restarts the demo's own cluster)
#   ./demo.sh status     is it running?
#   ./demo.sh stop       stop it (--purge also deletes /tmp/slurm-tpu-demo and its user)
# Options go to `python -m harness.demo` (see ./demo.sh --help).
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" != 0 ]; then
    echo "demo.sh: run it as root (sudo ./demo.sh): it installs packages and starts Slurm daemons" >&2
    exit 2
fi
case "${1:-run}" in
    status|stop) [ -x .venv/bin/python ] || scripts/setup.sh >&2 ;;  # no installing just to stop
    *) scripts/setup.sh >&2 ;;
esac
exec .venv/bin/python -m harness.demo "$@"
