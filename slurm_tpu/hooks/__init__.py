"""Slurm and udev hooks: prolog, epilog, task-prolog, udev event, and the node agent that runs them.

They run as root on every job, so they import little (no click, pyudev,
json, re, dataclasses, typing, enum or subprocess per job; yaml only when the
settings snapshot must be rebuilt, see settings.py), ask Slurm at most once (the
prolog, and only on nodes with leasable devices), never hand job-controlled
strings to a shell, never follow symlinks in the state directory, and only touch
device nodes the node's inventory file lists. The task-prolog is a POSIX sh script
(prolog/slurm-tpu-task-prolog) printing what the prolog prepared (protocol/envfile.py).
Each entry point returns an exit status; messages are one line each.

The fast path
-------------
:data:`FAST_PATH` is every module a root hook loads for a job or a device event
when nothing changed (the hooks' snapshot is current): the entry scripts
(prolog/slurm-tpu-prolog, epilog/slurm-tpu-epilog, the udev hook) and the
node agent's workers. It spans several packages (the formats in protocol/, the
ledger and ownership in access/, the Slurm query in slurm/), so it is declared
here, in one list, rather than by a folder. The rule for these modules: at module
level they import only :data:`FAST_PATH_STDLIB` and each other; anything else
(json, re, typing, yaml, subprocess, the families, the config...) is imported
inside the function that needs it, off the per-job path (annotations use
``TYPE_CHECKING = False`` / ``if TYPE_CHECKING:``). tests/test_fast_path.py checks
the rule from the source, naming module and line; tests/test_hooks_import_budget.py
measures what real hooks under slurmd import (``-X importtime``). A module that
joins the fast path (a hook imports it per job) is added here.
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
    "slurm_tpu.hooks.slurm_files",
    "slurm_tpu.hooks.udev_event",
)
# The standard library modules a fast-path module may import at module level: each is
# cheap, or already loaded by the interpreter itself under ``python3 -I -S``.
FAST_PATH_STDLIB = frozenset(
    {"__future__", "errno", "os", "select", "signal", "socket", "stat", "struct", "sys", "time"}
)
