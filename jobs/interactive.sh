#!/bin/sh
# Interactive use of an Edge TPU with srun (no batch script).
#
# One command on a TPU, output straight to your terminal:
#   srun --gres=tpu:1 slurm-tpu infer MODEL IMAGE --labels LABELS
# A shell on a TPU node; the TPU is yours until you exit the shell:
#   srun --gres=tpu:1 --pty /bin/bash -i
#   echo $SLURM_TPU_DEVICES          # which TPU you were given
#   slurm-tpu infer MODEL IMAGE      # as often as you like
#   exit                             # gives the TPU back
# A quick benchmark of a model on the TPU:
#   srun --gres=tpu:1 slurm-tpu infer MODEL --benchmark
#
# This script is the first recipe:  jobs/interactive.sh MODEL IMAGE [infer options]
set -eu
if [ $# -lt 2 ]; then
    echo "usage: jobs/interactive.sh MODEL IMAGE [slurm-tpu infer options]" >&2
    exit 2
fi
exec srun --job-name=interactive-tpu --gres=tpu:1 --ntasks=1 --time=00:05:00 slurm-tpu infer "$@"
