"""Where slurm-tpu looks for things unless told otherwise: the shared defaults, in one place.

The site config (slurm_tpu/config.py) starts from these; the root hooks use them
before (or instead of) reading it, so this module is stdlib-only and imports
nothing (it is on the hooks' fast path, see slurm_tpu/hooks/__init__.py). The sh
task prolog and the C client cannot import it: they repeat :data:`CONFIG_ENV`,
:data:`CONFIG_PATH` and :data:`STATE_DIR` (and the client :data:`STATE_DIR_ENV`), and
tests/test_fast_path.py checks that they agree.
"""

# The site config: this file, or the one the environment variable names.
CONFIG_PATH = "/etc/slurm-tpu/config.yaml"
CONFIG_ENV = "SLURM_TPU_CONFIG"

STATE_DIR = "/run/slurm-tpu"  # root's: leases, audit log, the hooks' snapshot and inventory (tmpfs)
# The state directory as the C client (a native entry) found it, in the environment of the Python
# hook it runs or the node agent it asks: they read the config for it only without this.
STATE_DIR_ENV = "SLURM_TPU_STATE_DIR"
# The node inventory's file name: <state_dir>/inventory.json (the hooks' copy, see
# slurm_tpu/protocol/inventory.py) and its persistent copy, restored at boot (/run is tmpfs).
INVENTORY_NAME = "inventory.json"
INVENTORY_FILE = "/var/lib/slurm-tpu/" + INVENTORY_NAME
# Where the epilog leaves each job's figures for accounting-collect (root-only 0700): persistent,
# so that entries not yet applied to Slurm's job records survive a reboot.
ACCOUNTING_SPOOL = "/var/lib/slurm-tpu/accounting-spool"
# The accounting collectors' window (seconds, ops/accounting.py): the same on every node.
ACCOUNTING_WINDOW_S = 30.0
SLOT_DIR = "/dev/slurm-tpu"  # the stable per-device slot nodes gres.conf names (<slot_dir>/<identity>)
SYSFS_ROOT = "/sys"

# Device node ownership: idle nodes belong to root:root, a leased node to the job's user;
# both root's (or the user's) alone, read-write.
IDLE_OWNER = "root"
IDLE_GROUP = "root"
NODE_MODE = 0o600
HOLDER_SCAN_S = 10.0  # the wall-clock budget of one holder scan at job end (seconds)
# Per-job energy (protocol/energy.py): the NVML library GPU counters are read through, and how often
# the node agent polls the power of devices without a counter (seconds).
NVML_LIBRARY = "libnvidia-ml.so.1"
ENERGY_POLL_S = 5.0

# Where `slurm-tpu install` puts things: the hooks under <prefix>/libexec/slurm-tpu,
# udev rules, systemd units and the config under <sysconfdir>.
PREFIX = "/usr/local"
SYSCONFDIR = "/etc"
