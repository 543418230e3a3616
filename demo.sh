#!/usr/bin/env bash
# The main job: set up slurm-tpu on this Debian machine (as root), detect this
# machine's accelerators, and generate gres.conf, the NodeName line and udev rules
# for a described example node (tests/hardware/big_node: 2 USB + 4 PCIe Edge TPUs,
# NVIDIA, AMD and Jetson GPUs), detected through real libudev under umockdev.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
ST=.venv/bin/slurm-tpu
echo
echo "== This machine: slurm-tpu detect"
$ST detect
OUT=${DEMO_OUT:-/tmp/slurm-tpu-demo}
mkdir -p "$OUT"
echo
echo "== Example node 'big' (tests/hardware/big_node.umockdev): detect"
run_on_example() {
    umockdev-run --device tests/hardware/big_node.umockdev -- \
        .venv/bin/python -m slurm_tpu.localcluster.testbed tests/hardware/big_node.extra -- "$@"
}
run_on_example $ST detect
# Save the inventory, then render outside the testbed: slurmd -C must see this
# machine's real CPUs and memory, not the simulated sysfs.
run_on_example $ST detect --json > "$OUT/big.inventory.json"
$ST gres-conf --inventory "$OUT/big.inventory.json" --node big --no-slots --output "$OUT/gres.conf"
$ST node-conf --inventory "$OUT/big.inventory.json" --node big --output "$OUT/nodes.conf"
$ST udev-rules --output "$OUT/60-slurm-tpu.rules"
for file in gres.conf nodes.conf 60-slurm-tpu.rules; do
    echo
    echo "== $OUT/$file"
    cat "$OUT/$file"
done
