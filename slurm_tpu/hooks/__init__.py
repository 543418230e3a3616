"""Slurm and udev hooks: prolog, epilog, task-prolog, udev event, and the node agent that runs them.

They run as root on every job, so they import little, ask Slurm at most once (the
prolog, and only on nodes with leasable devices), never hand job-controlled strings
to a shell, never follow symlinks in the state directory, and only touch device
nodes the node's inventory file lists. The task-prolog is a POSIX sh script
(prolog/slurm-tpu-task-prolog) printing what the prolog prepared (protocol/envfile.py).

:data:`FAST_PATH` is every module a root hook (or the agent's worker) loads for a job or
a device event when the hooks' snapshot is current, across packages. At module level
they import only :data:`FAST_PATH_STDLIB` and each other; anything else (json, re,
typing, yaml, subprocess, the families, the config...) is imported inside the function
that needs it (annotations: ``TYPE_CHECKING = False`` / ``if TYPE_CHECKING:``).
tests/test_fast_path.py checks the rule; tests/test_hooks_import_budget.py measures
what real hooks import. A module a hook imports per job is added here.
"""

# Lowest layer first (see tests/test_import_graph.py LAYERS).
FAST_PATH = (
    "slurm_tpu",
    "slurm_tpu.defaults",
    "slurm_tpu.errors",
    "slurm_tpu.identity",
    # The formats the hooks read and write.
    "slurm_tpu.protocol",
    "slurm_tpu.protocol.agent_wire",
    "slurm_tpu.protocol.audit",
    "slurm_tpu.protocol.broker_wire",
    "slurm_tpu.protocol.energy",
    "slurm_tpu.protocol.envfile",
    "slurm_tpu.protocol.hooks_snapshot",
    "slurm_tpu.protocol.inventory",
    "slurm_tpu.protocol.job_record",
    "slurm_tpu.protocol.jobenv",
    "slurm_tpu.protocol.leases",
    "slurm_tpu.protocol.usage",
    # The prolog's one Slurm query, and a drain.
    "slurm_tpu.slurm",
    "slurm_tpu.slurm.commands",
    "slurm_tpu.slurm.installation",
    "slurm_tpu.slurm.jobdetail",
    "slurm_tpu.slurm.spawn",
    # The state directory, the ledger, ownership, the holder scan, revocation, slot nodes.
    "slurm_tpu.access",
    "slurm_tpu.access.ledger",
    "slurm_tpu.access.node_inventory",
    "slurm_tpu.access.ownership",
    "slurm_tpu.access.processes",
    "slurm_tpu.access.revoke",
    "slurm_tpu.access.slots",
    "slurm_tpu.access.statedir",
    # A job's energy (when ``energy.enabled``): its start readings and figures, NVML, hwmon.
    "slurm_tpu.energy",
    "slurm_tpu.energy.figures",
    "slurm_tpu.energy.hwmon",
    "slurm_tpu.energy.nvml",
    # The hooks themselves, and the agent's workers.
    "slurm_tpu.hooks",
    "slurm_tpu.hooks.agent",
    "slurm_tpu.hooks.agent_query",
    "slurm_tpu.hooks.allocation",
    "slurm_tpu.hooks.context",
    "slurm_tpu.hooks.epilog",
    "slurm_tpu.hooks.jobusage",
    "slurm_tpu.hooks.leasing",
    "slurm_tpu.hooks.probe",
    "slurm_tpu.hooks.prolog",
    "slurm_tpu.hooks.settings",
    "slurm_tpu.hooks.shards",
    "slurm_tpu.hooks.slurm_files",
    "slurm_tpu.hooks.udev_event",
)
# The standard library modules a fast-path module may import at module level: each is
# cheap, or already loaded by the interpreter itself under ``python3 -I -S``.
FAST_PATH_STDLIB = frozenset(
    {"__future__", "errno", "os", "select", "signal", "socket", "stat", "struct", "sys", "time"}
)
