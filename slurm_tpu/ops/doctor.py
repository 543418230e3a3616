"""``slurm-tpu doctor``: check one node end to end, one line per problem with its fix.

For the admin whose job just failed with "Prolog error" or "Failed to load
delegate". Each check is a function returning :class:`Finding` s (none where it
does not apply: no GPU, no Vulkan check), reusing what the rest of slurm-tpu
knows (the Slurm gateway, the renderers, the hooks' state-directory rules).
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Callable

from .. import __version__
from ..access.ownership import NodeState, node_state
from ..config import Config
from ..errors import SlurmCommandError, SlurmTpuError
from ..families import FAMILIES, family
from ..hardware import Inventory
from .install import HOOK_FILES, SLURM_HOOKS, Layout, udev_reload, udev_run_program


@dataclass(frozen=True)
class Finding:
    """One checked fact: ``ok``, or a problem and what to do about it."""

    check: str
    ok: bool
    message: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.check}: {self.message}"
        return f"FAIL  {self.check}: {self.message}; fix: {self.fix}"


def _ok(check: str, message: str) -> list[Finding]:
    return [Finding(check, True, message)]


def _fail(check: str, message: str, fix: str) -> list[Finding]:
    return [Finding(check, False, message, fix)]


@dataclass
class Node:
    """What the checks look at: the site's choices, where things are, and the node's hardware."""

    config: Config
    layout: Layout
    slurm_conf: str
    node: str
    inventory: Inventory
    libedgetpu: str | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    @property
    def gres_conf(self) -> str:
        return os.path.join(os.path.dirname(self.slurm_conf), "gres.conf")

    def slurm_conf_text(self) -> str | None:
        """slurm.conf with its Include files appended; None when slurm.conf cannot be read."""
        from ..hooks.slurm_files import slurm_conf_files

        texts = []
        for index, path in enumerate(slurm_conf_files(self.slurm_conf)):
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    texts.append(handle.read())
            except OSError:
                if index == 0:
                    return None
        return "\n".join(texts)

    def options(self) -> dict[str, str]:
        from ..slurm.parse import parse_slurm_conf_options

        return parse_slurm_conf_options(self.slurm_conf_text() or "")


def _mode(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):04o}"


def _make_roots(path: str) -> str:
    """The fix for a file or directory root runs or reads that others can write."""
    return f"chown root:root {path} && chmod 0755 {path}"


def _unsafe(path: str) -> str | None:
    """Why root must not run/import ``path`` (not root's, or writable by others), else None."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if info.st_uid != 0 or info.st_mode & 0o022:
        return f"{path} is uid {info.st_uid} mode {_mode(info)}"
    return None


# ---- slurm.conf and the hooks -----------------------------------------------------------


def check_slurm_conf(node: Node) -> list[Finding]:
    if node.slurm_conf_text() is None:
        fix = "pass --slurm-conf FILE (or set SLURM_CONF) to the node's slurm.conf"
        return _fail("slurm.conf", f"cannot read {node.slurm_conf}", fix)
    return _ok("slurm.conf", node.slurm_conf)


def _root_program_problem(path: str, when: str, prefix: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) when ``path``, a program root runs ``when``, is missing, no
    executable file, or writable by someone other than root; None when it is fine."""
    if not os.path.lexists(path):
        return f"{path} is missing", f"slurm-tpu install --prefix {prefix}"
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o100:
        return f"{path} is not an executable file", f"slurm-tpu install --prefix {prefix}"
    why = _unsafe(path)  # a regular file, not a link: stat is lstat
    return (f"{why}: whoever can write it runs code as root {when}", _make_roots(path)) if why else None


def check_hooks(node: Node) -> list[Finding]:
    """slurm.conf names our Prolog/Epilog/TaskProlog/HealthCheckProgram (a hook or its native entry, both
    ours); what it names exists, root's, not writable by others, and so does the Python hook a native entry runs."""
    from ..defaults import CONFIG_PATH

    options, layout = node.options(), node.layout
    findings, natives = [], []
    for option in SLURM_HOOKS:
        hook_file, entry = layout.hook_file(option), layout.native_entry(option)
        named = [p for p in options.get(option.lower(), "").split(",") if p]
        if entry and entry in named:
            natives.append(option)
            if not layout.native_entries_fit:
                findings += _fail(
                    "hooks",
                    f"slurm.conf {option}={entry} reads {CONFIG_PATH}, not this installation's {layout.config_file}",
                    f"set {option}={hook_file} in {node.slurm_conf}, then scontrol reconfigure",
                )
                continue
            programs = [entry, hook_file]  # the native entry execs its Python hook when the agent is away
        elif hook_file in named:
            programs = [hook_file]
        else:
            ours = layout.hook(option)
            now = f"names {','.join(named)}" if named else "has no such line"
            findings += _fail(
                "hooks",
                f"slurm.conf {option}= {now}, not slurm-tpu's {ours}",
                f"set {option}={ours} in {node.slurm_conf}, then scontrol reconfigure",
            )
            continue
        for program in programs:
            problem = _root_program_problem(program, "on every job", layout.prefix)
            if problem:
                findings += _fail("hooks", f"{option} {problem[0]}", problem[1])
                break
    directory = _unsafe(layout.hooks_dir)
    if directory and os.path.isdir(layout.hooks_dir):
        findings += _fail("hooks", f"hooks directory {directory}", _make_roots(layout.hooks_dir))
    native = f" ({', '.join(natives)}: native entries)" if natives else ""
    everything = f"{', '.join(SLURM_HOOKS)} are slurm-tpu's in {layout.hooks_dir}{native}"
    return findings or _ok("hooks", f"{everything}, root's, not writable by others")


def _listed(options: dict[str, str], option: str, wanted: list[str]) -> tuple[list[str], list[str], str]:
    """(what slurm.conf's list ``option`` holds, what of ``wanted`` it lacks, the ``option=`` line with both)."""
    have = [t.strip() for t in options.get(option.lower(), "").split(",") if t.strip()]
    lacking = [n for n in wanted if n not in have]
    return have, lacking, f"{option}={','.join(dict.fromkeys(have + lacking))}"


def check_gres_types(node: Node) -> list[Finding]:
    """GresTypes lists the first family's GRES (tpu) always, every family's the node has devices of,
    and the shard GRES (tpu_shard, shard) of every device the node shares."""
    from ..render import shard_counts

    names = [
        node.config.family(f.kind).gres_name for i, f in enumerate(FAMILIES) if i == 0 or node.inventory.usable(f.kind)
    ]
    shards = list(shard_counts(node.inventory, node.config))
    have, lacking, line = _listed(node.options(), "GresTypes", names + shards)
    if lacking:
        message = f"slurm.conf GresTypes={','.join(have)} lacks {','.join(lacking)}"
        shared = [name for name in lacking if name in shards]
        if shared:
            message += f" ({','.join(shared)}: the config shares {node.node}'s devices)"
        return _fail("GresTypes", message, f"set {line} in {node.slurm_conf} and restart slurmctld and slurmd")
    return _ok("GresTypes", ",".join(have))


def check_accounting_tres(node: Node) -> list[Finding]:
    """With Slurm's accounting on, AccountingStorageTRES lists every GRES name and type of the node."""
    from ..render.node_conf import inventory_tres
    from .accounting import accounting_on

    options = node.options()
    if not accounting_on(options):
        return _ok("AccountingStorageTRES", "Slurm's accounting is off (no slurmdbd): nothing to track")
    have, lacking, line = _listed(options, "AccountingStorageTRES", inventory_tres(node.inventory, node.config))
    if lacking:
        return _fail(
            "AccountingStorageTRES",
            f"slurm.conf AccountingStorageTRES lacks {','.join(lacking)}: sacct, sreport and QOS "
            f"limits do not see {node.node}'s GRES",
            f"set {line} in {node.slurm_conf} and restart slurmctld",
        )
    return _ok("AccountingStorageTRES", ",".join(have) or "(no GRES here)")


# What each of Slurm's acct_gather_energy plugins measures (its sacct ConsumedEnergy is per node).
NODE_ENERGY_PLUGINS = {
    "rapl": "the processors' and memory's RAPL counters, not the accelerators",
    "ipmi": "the whole node's power from its BMC",
    "pm_counters": "the whole node's power counters (HPE Cray)",
    "xcc": "the whole node's power from Lenovo XClarity",
    "gpu": "AMD GPUs only (its NVIDIA energy read is an empty stub)",
}


def node_energy_plugins(value: str) -> list[str]:
    """The plugins an ``AcctGatherEnergyType`` value names (``acct_gather_energy/rapl,...``; stackable since
    20.02), as Slurm reads it: a value naming ``none`` anywhere is none, ``rsmi`` is ``gpu``; scontrol
    show config prints ``(null)`` for none (25.11) or ``acct_gather_energy/none`` (22.05)."""
    if "none" in value.lower() or value.strip() in ("", "(null)"):
        return []
    names = (part.strip().rpartition("/")[2] for part in value.split(","))
    return list(dict.fromkeys("gpu" if name == "rsmi" else name for name in names if name))


def check_energy(node: Node) -> list[Finding]:
    """Two lines, never a failure: whether this node's Slurm collects node energy (AcctGatherEnergyType)
    and what slurm-tpu's per-device figures add to it (docs/accounting.md, "Energy")."""
    plugins = node_energy_plugins(node.options().get("acctgatherenergytype", ""))
    if plugins:
        what = "; ".join(f"{name}: {NODE_ENERGY_PLUGINS.get(name, 'its own sensors')}" for name in plugins)
        slurm = (
            f"Slurm collects node energy here (AcctGatherEnergyType {', '.join(plugins)}: {what}): sacct's "
            "ConsumedEnergy is the node's, a job's own only when the job had the node to itself"
        )
    else:
        slurm = (
            "Slurm collects no node energy here (AcctGatherEnergyType unset or none): sacct's ConsumedEnergy "
            "stays empty; acct_gather_energy/rapl or ipmi would add the node's"
        )
    kinds = sorted({a.kind for a in node.inventory})
    if not node.config.energy.enabled:
        ours = (
            "energy is off here (config energy.enabled: false): slurm-tpu reads no device and adds no "
            "per-device energy figures (set energy.enabled: true, or leave it out, to have them)"
        )
    elif kinds:
        ours = (
            f"slurm-tpu adds each job's energy on each accelerator it held ({len(node.inventory)} here: "
            f"{', '.join(kinds)}), its own even on a shared node, with its method (measured, integrated, "
            "estimated, self-reported): AdminComment, slurm-tpu report, metrics"
        )
    else:
        ours = "no accelerators here: slurm-tpu adds no per-device energy figures"
    return _ok("node energy", slurm) + _ok("device energy", ours)


ACCOUNTING_TIMER = "slurm-tpu-accounting.timer"  # what `systemctl enable` links into timers.target.wants


def _accounting_spool_problem(path: str) -> tuple[str, str] | None:
    """(problem, fix) when the accounting spool exists but the epilog would refuse it (its own test,
    jobusage.open_spool: not root's 0700, a link, a parent others can write or a link); None when it
    is fine or not made yet."""
    from ..access.statedir import StateDirError
    from ..hooks.jobusage import open_spool

    if not os.path.lexists(path):
        return None
    try:
        os.close(open_spool(path))
        return None
    except StateDirError as exc:
        refused = str(exc)
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"accounting spool {path}: {exc.strerror}", f"check {path}"
    if not stat.S_ISDIR(info.st_mode):
        return f"accounting spool {path} is not a directory: the epilog spools nothing", f"remove {path}"
    if info.st_uid != 0 or info.st_mode & 0o077:
        what = f"uid {info.st_uid} mode {_mode(info)}"
        fix = f"chown root:root {path} && chmod 0700 {path}"
        return f"accounting spool {path} is {what}, not root's 0700: the epilog spools nothing", fix
    parent = os.path.dirname(path)
    fix = f"make {parent} a directory of root's, not a link" if os.path.islink(parent) else _make_roots(parent)
    return f"accounting spool {path}: {refused}: the epilog spools nothing", fix


def check_accounting_collector(node: Node) -> list[Finding]:
    """Where Slurm's accounting is on: ``slurm-tpu-accounting.{service,timer}`` installed as this slurm-tpu
    ships them and the timer enabled (and running, where systemd runs), and the spool safe."""
    from ..files import read_text
    from .accounting import accounting_on
    from .install import ACCOUNTING_UNITS, planned_units

    check = "accounting collector"
    if not accounting_on(node.options()):
        return _ok(check, "Slurm's accounting is off (no slurmdbd): no collector needed")
    layout = node.layout
    install = f"slurm-tpu install --sysconfdir {layout.sysconfdir}"
    for spec in planned_units(layout, os.path.dirname(node.slurm_conf), ACCOUNTING_UNITS):
        have = read_text(spec.path) if os.path.isfile(spec.path) else None
        if have is None:
            message = f"{spec.path} is missing: no collector puts the jobs' inference figures into Slurm's AdminComment"
            return _fail(check, message, install)
        if have != spec.content:
            return _fail(check, f"{spec.path} is stale (not what this slurm-tpu installs)", install)
    enabled = os.path.join(layout.systemd_dir, "timers.target.wants", ACCOUNTING_TIMER)
    start = f"systemctl enable --now {ACCOUNTING_TIMER}"
    if not os.path.lexists(enabled):
        message = f"{ACCOUNTING_TIMER} is not enabled: the epilog spools no figures and none reach Slurm's AdminComment"
        return _fail(check, message, start)
    if layout.is_system and os.path.isdir("/run/systemd/system"):
        try:
            active = (
                subprocess.run(
                    ["systemctl", "is-active", "--quiet", ACCOUNTING_TIMER], capture_output=True, timeout=20
                ).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            active = True  # cannot tell: the enabled link is what doctor can vouch for
        if not active:
            return _fail(check, f"{ACCOUNTING_TIMER} is enabled but not running", start)
    problem = _accounting_spool_problem(node.config.accounting_spool)
    if problem:
        return _fail(check, *problem)
    return _ok(check, f"{ACCOUNTING_TIMER} enabled; spool {node.config.accounting_spool}")


BROKER_UNIT = "slurm-tpu-broker.service"


def check_broker(node: Node) -> list[Finding]:
    """On a node whose config shares Edge TPUs: the TPU broker's unit installed as this slurm-tpu ships it,
    enabled, its control socket answering ``ping`` with every device alive (docs/architecture.md, "The TPU
    broker"); elsewhere nothing is needed."""
    from ..files import read_text
    from ..hooks import shards
    from .install import planned_units

    check = "tpu broker"
    config = node.config
    if not config.family("edgetpu").shared:
        return _ok(check, "this node shares no Edge TPU (families.edgetpu.shared): no broker needed")
    layout = node.layout
    install = f"slurm-tpu install --sysconfdir {layout.sysconfdir}"
    [spec] = planned_units(layout, os.path.dirname(node.slurm_conf), (BROKER_UNIT,), state_dir=config.state_dir)
    have = read_text(spec.path) if os.path.isfile(spec.path) else None
    if have is None:
        return _fail(check, f"{spec.path} is missing: nothing runs the broker the shard jobs need", install)
    if have != spec.content:
        return _fail(check, f"{spec.path} is stale (not what this slurm-tpu installs)", install)
    start = f"systemctl enable --now {BROKER_UNIT}"
    if not os.path.lexists(os.path.join(layout.systemd_dir, "multi-user.target.wants", BROKER_UNIT)):
        return _fail(check, f"{BROKER_UNIT} is not enabled: after a reboot shard jobs find no broker", start)
    try:
        answer = shards.ask(config.state_dir, {"op": "ping"})
    except shards.BrokerUnavailable as exc:
        message = f"the broker does not answer ping ({exc}): shard jobs start, but their clients cannot run"
        return _fail(check, message, f"{start}; journalctl -u {BROKER_UNIT}")
    if answer.get("devices_alive") is False:
        message = "the broker answers, but a device's thread died: that TPU's shard jobs wait in vain"
        return _fail(check, message, f"systemctl restart {BROKER_UNIT}; journalctl -u {BROKER_UNIT}")
    return _ok(check, f"{BROKER_UNIT} enabled; its control socket answers")


def check_gres_conf(node: Node) -> list[Finding]:
    """This node's gres.conf block is what ``gres-conf --check`` expects."""
    from ..files import changed_lines, merge_block, read_text
    from ..render import render_gres_conf

    old = read_text(node.gres_conf)
    new = merge_block(old, "gres", node.node, render_gres_conf(node.inventory, node.config, node.node), node.gres_conf)
    if old != new:
        return _fail(
            "gres.conf",
            f"{node.gres_conf} differs from {node.node}'s hardware ({changed_lines(old, new, node.gres_conf)} line(s))",
            f"slurm-tpu gres-conf --output {node.gres_conf}, then restart slurmd",
        )
    return _ok("gres.conf", f"{node.node}'s block in {node.gres_conf} matches the hardware")


def check_node_line(node: Node) -> list[Finding]:
    """The node's NodeName line has the Gres= and Feature= ``node-conf`` writes."""
    from ..render import node_features, node_gres
    from ..slurm.parse import node_line_fields

    fields = node_line_fields(node.slurm_conf_text() or "", node.node)
    if fields is None:
        return _fail(
            "NodeName",
            f"no NodeName line for {node.node} in {node.slurm_conf} or its Includes",
            f"slurm-tpu node-conf --output {os.path.dirname(node.slurm_conf)}/nodes.conf and "
            "Include it from slurm.conf",
        )
    want_gres, want_features = node_gres(node.inventory, node.config), node_features(node.inventory, node.config)
    have_gres = fields.get("Gres", "")
    have_features = [f for f in fields.get("Feature", fields.get("Features", "")).split(",") if f]
    wrong = []
    if have_gres != want_gres:
        wrong.append(f"Gres={have_gres or '(none)'}, the hardware gives Gres={want_gres or '(none)'}")
    if set(have_features) != set(want_features):
        wrong.append(
            f"Feature={','.join(have_features) or '(none)'}, the hardware gives "
            f"Feature={','.join(want_features) or '(none)'}"
        )
    if wrong:
        return _fail(
            "NodeName",
            f"NodeName={node.node} has " + "; ".join(wrong),
            "slurm-tpu node-conf --output FILE (the file holding the line), then restart slurmctld and slurmd",
        )
    return _ok("NodeName", f"Gres={want_gres or '(none)'} Feature={','.join(want_features) or '(none)'}")


# ---- udev and the state directory ---------------------------------------------------------


def check_udev_rules(node: Node) -> list[Finding]:
    """The installed rules are the ones this config renders."""
    from ..files import read_text
    from ..render.udev_rules import render_udev_rules

    path = node.layout.udev_rules
    try:
        run = udev_run_program(node.layout, node.config)
    except SlurmTpuError as exc:  # udev.run_program that udev could not run
        fix = f"fix udev.run_program in {node.config.path or 'the slurm-tpu config'}, or drop it"
        return _fail("udev rules", str(exc), fix)
    if not os.path.exists(path) or read_text(path) != render_udev_rules(node.config, run):
        what = "differs from what this config renders" if os.path.exists(path) else "is missing"
        return _fail("udev rules", f"{path} {what}", f"slurm-tpu install --sysconfdir {node.layout.sysconfdir}")
    # The program udev runs on every device event: there, and only root can change it. The one
    # install writes is a plain file; a site's udev.run_program may be a link (to a venv's console script).
    program = run.split()[0]
    if program != node.layout.udev_hook:
        program = os.path.realpath(program)
    problem = _root_program_problem(program, "on every device event", node.layout.prefix)
    if problem:
        return _fail("udev rules", f"{path} runs {problem[0]}", problem[1])
    return _ok("udev rules", f"{path} (RUN+={run})")


def _managed_nodes(node: Node) -> list[tuple[str, str]]:
    """(identity, device node) of the accelerators the udev rules own while idle. A USB stick's node
    changes on every re-enumeration, which the state directory's inventory follows: its nodes win."""
    from .node_state import configured_document

    document = configured_document(node.config) or {}
    current = {
        entry.get("identity"): entry.get("device_nodes") or []
        for entry in document.get("accelerators", [])
        if isinstance(entry, dict)
    }
    nodes = []
    for accelerator in node.inventory.usable():
        paths = current.get(accelerator.identity) or accelerator.device_nodes
        if family(accelerator.kind).slot:
            nodes += [(accelerator.identity, path) for path in paths]
        elif node.config.family(accelerator.kind).lease:  # leased GPUs: udev owns only the render nodes
            nodes += [(accelerator.identity, path) for path in paths if os.path.basename(path).startswith("renderD")]
    return nodes


def check_udev_loaded(node: Node) -> list[Finding]:
    """Idle devices really have the rules' ownership (root 0600 by default)."""
    import grp
    import pwd

    from .node_state import lease_holders

    idle = node.config.idle
    try:
        want = (pwd.getpwnam(idle.owner).pw_uid, grp.getgrnam(idle.group).gr_gid, idle.mode)
    except KeyError as exc:
        message = f"devices.idle names an unknown user or group ({exc})"
        return _fail("udev loaded", message, "fix devices.idle in the slurm-tpu config")
    rules = f"{idle.owner}:{idle.group} {idle.mode:04o}"
    leased = lease_holders(node.config)[0]
    findings, checked = [], 0
    for identity, path in _managed_nodes(node):
        if identity in leased:
            continue
        try:
            info = os.stat(path)
        except OSError:
            continue  # a missing device is the health check's business
        checked += 1
        if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != want:
            findings += _fail(
                "udev loaded",
                f"idle {identity} {path} is uid {info.st_uid} gid {info.st_gid} mode "
                f"{_mode(info)}, the rules give {rules}: "
                "udev has not applied slurm-tpu's rules (or a later rule overrides them)",
                " && ".join(" ".join(argv) for argv in udev_reload(node.config)),
            )
    return findings or _ok("udev loaded", f"{checked} idle device node(s) are {rules}")


def state_dir_problems(state_dir: str) -> list[tuple[str, str]]:
    """(problem, fix) for the hooks' state directory; the one place that knows its layout.

    The hooks refuse one (or leases/, jobs/, job-usage/) not root's or group/world-writable; the
    task-prolog and the runner, as the job's user, must pass through it, jobs/ and job-usage/.
    """
    from ..access import statedir
    from ..access.ledger import LEASES
    from ..hooks.jobusage import BOX_DIR
    from ..protocol.envfile import DIR as JOBS

    try:
        fd = statedir.open_dir(state_dir)
    except statedir.StateDirError as exc:
        if not os.path.lexists(state_dir):
            make = "slurm-tpu gres-conf --output <gres.conf> (or slurm-tpu boot after a reboot)"
            return [(f"state directory {state_dir} does not exist", make)]
        return [(str(exc), _make_roots(state_dir))]
    problems = []
    try:
        if not os.fstat(fd).st_mode & 0o001:
            why = f"{state_dir} is mode {_mode(os.fstat(fd))}: the task-prolog (the job's user) cannot reach jobs/"
            problems.append((why, _make_roots(state_dir)))
        for name, traversable in ((LEASES, False), (JOBS, True), (BOX_DIR, True)):
            path = os.path.join(state_dir, name)
            if not os.path.lexists(path):
                continue
            try:
                sub = statedir.open_dir(name, parent_fd=fd)
            except statedir.StateDirError as exc:
                problems.append((f"{path}: {exc}", _make_roots(path)))
                continue
            if traversable and not os.fstat(sub).st_mode & 0o001:
                why = f"{path} is mode {_mode(os.fstat(sub))}: the task-prolog cannot read it"
                problems.append((why, _make_roots(path)))
            os.close(sub)
    finally:
        os.close(fd)
    return problems


def check_state_dir(node: Node) -> list[Finding]:
    findings = [Finding("state dir", False, problem, fix) for problem, fix in state_dir_problems(node.config.state_dir)]
    return findings or _ok("state dir", f"{node.config.state_dir} root's, mode 0755-like")


# ---- the hooks' Python ---------------------------------------------------------------------

_IMPORT_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import slurm_tpu, slurm_tpu.hooks.prolog, slurm_tpu.hooks.epilog
print(slurm_tpu.__version__)
print(slurm_tpu.__file__)
"""


def _hook_python(path: str) -> tuple[str, str] | None:
    """(interpreter, directory holding slurm_tpu) a Python hook runs with, as its own lines say."""
    import ast

    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read(8192).splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith("#!") or "python" not in lines[0]:
        return None
    root = os.path.dirname(os.path.dirname(os.path.realpath(path)))  # a checkout's hook
    for line in lines:
        if line.startswith("_ROOT = "):
            value = line[len("_ROOT = ") :].split("  #", 1)[0].strip()
            try:
                root = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                pass
    return lines[0][2:].split()[0], root


def check_hooks_import(node: Node) -> list[Finding]:
    """The Python hooks import slurm-tpu under ``-I -S`` (no site-packages), this very version,
    from files only root can change."""
    findings, probed = [], set()
    fix = f"slurm-tpu install --prefix {node.layout.prefix} (with the slurm-tpu jobs and health use)"
    for _, name, _ in HOOK_FILES:
        found = _hook_python(os.path.join(node.layout.hooks_dir, name))
        if found is None or found in probed:
            continue  # not a Python hook, or missing (check_hooks says so), or probed already
        probed.add(found)
        python, root = found
        argv = [python, "-I", "-S", "-c", _IMPORT_PROBE, root]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
            out, err, code = done.stdout.splitlines(), done.stderr.strip(), done.returncode
        except OSError as exc:
            out, err, code = [], str(exc), -1
        if code != 0 or len(out) < 2:
            last = err.splitlines()[-1] if err else f"exit status {code}"
            findings += _fail(
                "hooks import", f"{name}: {python} -I -S cannot import slurm_tpu from {root}: {last}", fix
            )
            continue
        if out[0] != __version__:
            findings += _fail(
                "hooks import", f"{name} imports slurm-tpu {out[0]} ({out[1]}), this is {__version__}", fix
            )
        unsafe = [why for why in (_unsafe(python), _unsafe(root), _unsafe(os.path.dirname(out[1]))) if why]
        if unsafe:
            message = f"{name} runs as root with code others can change: " + "; ".join(unsafe)
            findings += _fail("hooks import", message, "install slurm-tpu where only root can write")
    if not probed:
        return []  # no Python hook installed: check_hooks says so
    pythons = ", ".join(sorted({p for p, _ in probed}))
    return findings or _ok("hooks import", f"slurm-tpu {__version__} under {pythons} -I -S")


# ---- Slurm, runtimes, munge -----------------------------------------------------------------


# Under /dev, the mounts where no accelerator's node lives and users may write (a user cannot mknod, and
# nodes there are nodev anyway): not walked.
_NOT_WALKED = ("/dev/shm", "/dev/mqueue", "/dev/pts", "/dev/hugepages")


def unmanaged_nodes(rdevs: dict[int, str], managed: set[str], root: str = "/dev") -> list[NodeState]:
    """Char device nodes under ``root`` with the numbers of a leased device (``rdevs``: rdev -> identity)
    that the suite does not manage (not in ``managed``, its nodes and slots).

    The lease gives a device's own nodes to the job and back to root; another node with the
    same numbers (an admin's mknod, a copy) keeps whatever owner and mode it has, so whoever
    it lets in opens the device, whichever job holds it. Read by ``slurm-tpu doctor``; nodes
    outside ``root`` (a container's own /dev) are not looked for here.
    """
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [name for name in subdirs if os.path.join(directory, name) not in _NOT_WALKED]
        for name in files:
            path = os.path.join(directory, name)
            state = node_state(path)
            if state is not None and state.rdev in rdevs and path not in managed:
                found.append(state)
    return found


def check_unmanaged_nodes(node: Node, dev_root: str = "/dev") -> list[Finding]:
    """Device nodes under /dev with an accelerator's numbers that are not its own or its slot: the hooks
    give a device's own nodes to the job that leases it and back to root, never such a copy, so whoever
    the copy's owner and mode let in opens the device, whichever job holds it."""
    rdevs: dict[int, str] = {}
    managed: set[str] = set()
    for accelerator in node.inventory:
        managed.add(os.path.join(node.config.slot_dir, accelerator.identity))
        for path in accelerator.device_nodes:
            state = node_state(path)
            if state is not None:
                rdevs[state.rdev] = accelerator.identity
                managed.add(path)
    if not node.inventory.accelerators:
        return []
    found = unmanaged_nodes(rdevs, managed, dev_root) if rdevs else []
    if not found:
        return _ok("device nodes", f"no other node under {dev_root} has an accelerator's numbers")
    return [
        Finding(
            "device nodes",
            False,
            f"{state.path} has {rdevs[state.rdev]}'s numbers ({os.major(state.rdev)}:{os.minor(state.rdev)}) "
            f"but is not one slurm-tpu leases (uid {state.uid}, mode {state.mode:04o}): whoever it lets in opens "
            "the device, whichever job holds it",
            f"rm {state.path}",
        )
        for state in found
    ]


def check_slurmd_version(node: Node) -> list[Finding]:
    from ..slurm.commands import Slurm
    from ..slurm.installation import TESTED_RELEASES, is_tested_release, version_of

    try:
        slurmd = Slurm.for_config(node.config, node.environ).program("slurmd")
    except SlurmCommandError as exc:
        fix = "install Slurm's slurmd, or name its directory in slurm.sbin_dir"
        return _fail("slurmd", str(exc).split(":", 1)[0], fix)
    version = version_of(slurmd, node.environ)
    tested = " and ".join(f"{release}.x" for release in TESTED_RELEASES)
    if version is None:
        return _fail("slurmd", f"{slurmd} -V does not say its version", f"check {slurmd}")
    if not is_tested_release(version):
        message = f"{slurmd} is Slurm {version}, which slurm-tpu is not tested with ({tested})"
        return _fail("slurmd", message, f"run Slurm {tested}, or test this release first")
    return _ok("slurmd", f"{slurmd} is Slurm {version}")


def check_device_cgroup(node: Node) -> list[Finding]:
    """Slurm's device cgroup (ConstrainDevices=yes): where it holds for the node's Edge TPUs
    (slurm_tpu/slurm/device_cgroup.py says why)."""
    from ..slurm import device_cgroup
    from ..slurm.commands import Slurm
    from ..slurm.installation import version_of

    try:
        version = version_of(Slurm.for_config(node.config, node.environ).program("slurmd"), node.environ)
    except SlurmCommandError:
        version = None
    has_tpu = device_cgroup.needs_the_fix({node.config.family(a.kind).gres_name for a in node.inventory})
    fine, what, fix = device_cgroup.status(node.options(), node.slurm_conf, version, has_tpu)
    return [Finding("device cgroup", fine, what, fix)]


def check_gres_plugin(node: Node) -> list[Finding]:
    """Our gres/tpu Slurm plugin in slurm.conf's PluginDir, on a node with Edge TPUs: with it the
    Prolog reads the job's Edge TPUs from its environment, without it each Prolog asks slurmctld.
    Optional, so never a failure; the line says which of the two the node does."""
    from ..hooks.allocation import PLUGIN_ENV
    from ..slurm.gres_plugin import PLUGIN_FILE, in_plugin_dir

    names = {node.config.family(a.kind).gres_name for a in node.inventory}
    if not names & set(PLUGIN_ENV):
        return []
    found = in_plugin_dir(node.options())
    if found is None:
        return _ok(
            "gres plugin",
            f"no {PLUGIN_FILE} in slurm.conf's PluginDir: each Prolog asks slurmctld for the job's "
            "Edge TPUs (one RPC per job); to spare it, build the plugin for this Slurm release "
            "(docs/admin-guide.md, 'The gres/tpu Slurm plugin')",
        )
    others = sorted(names - set(PLUGIN_ENV))
    how = (
        f"yet this node also leases {', '.join(others)}, so each Prolog still asks slurmctld"
        if others
        else "the Prolog takes the job's Edge TPUs from SLURM_JOB_TPUS and asks slurmctld nothing"
    )
    return _ok("gres plugin", f"{found}/{PLUGIN_FILE} is in PluginDir: {how}")


def _visible_devices(library: str) -> list[Finding]:
    """Whether the node's libedgetpu shows a job only its own Edge TPUs (EDGETPU_VISIBLE_DEVICES)."""
    from .edgetpu_runtime import visible_devices_problem

    problem = visible_devices_problem(library)
    if problem is None:
        return _ok("EDGETPU_VISIBLE_DEVICES", f"{library} shows a job only its own Edge TPUs")
    fix = (
        "build it with scripts/build-libedgetpu.sh and run 'slurm-tpu install --libedgetpu "
        "<the built libedgetpu.so.1>' (docs/admin-guide.md: The Edge TPU runtime)"
    )
    return _fail("EDGETPU_VISIBLE_DEVICES", problem, fix)


def check_runtimes(node: Node) -> list[Finding]:
    """libedgetpu where the node has Edge TPUs; a TFLite runtime where it has any; Vulkan for GPUs."""
    runners = {f.runner for f in FAMILIES if node.inventory.usable(f.kind)}
    tpus, gpus = "edgetpu" in runners, "gpu" in runners
    if not (tpus or gpus):
        return []
    findings = []
    extras = "pip install 'slurm-tpu[infer]' into the environment slurm-tpu runs from"
    try:
        from ..runner import engines
        from ..runner.errors import RuntimeMissingError
    except ImportError as exc:
        return _fail("TFLite runtime", f"the inference modules cannot load ({exc})", extras)
    if tpus:
        from ..runner.errors import LibEdgeTpuError

        try:
            library = engines.EdgeTpuLibrary(node.libedgetpu)
            findings += _ok("libedgetpu", f"{library.path} ({library.version() or 'no version'})")
            findings += _visible_devices(library.path)
        except LibEdgeTpuError as exc:
            message, _, fix = str(exc).partition(": install")
            fix = f"install{fix}" if fix else "install libedgetpu1-std from Coral's apt repository"
            findings += _fail("libedgetpu", message, fix)
    try:
        name = engines.select_runtime()
        findings += _ok("TFLite runtime", f"{name} {engines.runtime_version(name)}")
    except RuntimeMissingError as exc:
        findings += _fail("TFLite runtime", str(exc).split("): ")[0] + ")", extras)
    if gpus:
        import ctypes

        try:
            ctypes.CDLL("libvulkan.so.1")
            findings += _ok("Vulkan", "libvulkan.so.1 loads")
        except OSError as exc:
            message = f"libvulkan.so.1 cannot be loaded ({exc}): LiteRT's GPU path needs it"
            findings += _fail("Vulkan", message, "apt install libvulkan1 and the GPU's Vulkan driver")
        if len(node.inventory.usable("gpu")) > 1:
            findings += _vulkan_device_select()
    return findings


def _vulkan_device_select() -> list[Finding]:
    """On a multi-GPU node: whether the runner can ask Vulkan for the job's GPU (runner/gpu_select.py)."""
    from ..runner import gpu_select

    layer = gpu_select.device_select_layer()
    if layer:
        message = f"Mesa's device-select layer ({layer}) lets the runner open the job's GPU by PCI address"
        return _ok("Vulkan GPU selection", message)
    return _fail(
        "Vulkan GPU selection",
        "Mesa's device-select layer is not installed: on this multi-GPU "
        "node the runner's GPU path takes the first GPU Vulkan lists unless the device cgroup or "
        "families.gpu.isolate hides the others",
        "apt install mesa-vulkan-drivers",
    )


def check_munge(node: Node) -> list[Finding]:
    """``munge -n | unmunge`` through the socket slurm.conf's AuthInfo names."""
    socket = ""
    for item in node.options().get("authinfo", "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "socket":
            socket = value.strip()
    extra = [f"--socket={socket}"] if socket else []
    fix = "start munged (systemctl start munge) with the cluster's /etc/munge/munge.key"
    try:
        credential = subprocess.run(["munge", "-n", *extra], capture_output=True, text=True, timeout=20)
        if credential.returncode == 0:
            decoded = subprocess.run(
                ["unmunge", *extra], input=credential.stdout, capture_output=True, text=True, timeout=20
            )
            error = "" if decoded.returncode == 0 else decoded.stderr.strip()
        else:
            error = credential.stderr.strip()
    except OSError as exc:
        error = f"{exc.strerror}: install munge"
    if error:
        return _fail("munge", f"munge -n | unmunge fails: {error.splitlines()[-1]}", fix)
    return _ok("munge", f"munge -n | unmunge works{' via ' + socket if socket else ''}")


# Rootful container runtimes' API sockets: whoever may write one runs containers as root.
ROOTFUL_SOCKETS = ("/run/podman/podman.sock", "/run/docker.sock", "/var/run/docker.sock")


def _users_writable(info: os.stat_result) -> str | None:
    """Who besides root may write a socket with this owner and mode (None: nobody)."""
    if info.st_mode & 0o002:
        return "every user"
    if info.st_mode & 0o020 and info.st_gid != 0:
        import grp

        try:
            return f"group {grp.getgrgid(info.st_gid).gr_name}"
        except KeyError:
            return f"group {info.st_gid}"
    if info.st_uid != 0 and info.st_mode & 0o200:
        return f"uid {info.st_uid}"
    return None


def check_containers(node: Node) -> list[Finding]:
    """Containers: no users-writable rootful runtime socket (a rootful container makes its own device
    nodes, so ownership no longer isolates); this node's CDI specs (``slurm-tpu cdi``) current."""
    import shutil
    import tempfile

    from ..render import cdi as render
    from .cdi import libraries_in, ours, write_cdi

    findings: list[Finding] = []
    seen = set()
    for path in ROOTFUL_SOCKETS:
        try:
            info = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(info.st_mode) or (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        who = _users_writable(info)
        if who:
            findings += _fail(
                "rootful containers",
                f"{path} ({_mode(info)}) lets {who} run rootful containers: they make their own device "
                "nodes, so any device of the node is theirs, whoever's job holds it (docs/security.md)",
                f"chmod 0600 {path} (users run rootless Podman: docs/user-guide.md)",
            )
    if not findings:
        findings += _ok("rootful containers", "no users-writable rootful container runtime socket")
    leased = [a for a in node.inventory.usable() if node.config.family(a.kind).lease and a.device_nodes]
    if not leased:
        return findings
    held = [(directory, ours(directory)) for directory in render.CDI_DIRS if ours(directory)]
    if not held:
        return findings + _ok(
            "CDI",
            f"no slurm-tpu spec in {' or '.join(render.CDI_DIRS)}: containers name no device "
            f"(slurm-tpu cdi --output {render.CDI_DIR})",
        )
    for directory, mine in held:
        with tempfile.TemporaryDirectory() as scratch:  # what `slurm-tpu cdi` would change, on copies
            for path in mine:
                shutil.copyfile(path, os.path.join(scratch, os.path.basename(path)))
            result = write_cdi(scratch, node.inventory, node.config, libraries_in(directory))
        if result.written or result.removed:
            findings += _fail(
                "CDI",
                f"this node's CDI specs in {directory} differ from its devices",
                f"slurm-tpu cdi --output {directory} (gres-conf --output and the watcher keep them current after that)",
            )
        else:
            findings += _ok("CDI", f"{len(mine)} spec(s) in {directory} match the devices")
    return findings


CHECKS: tuple[Callable[[Node], list[Finding]], ...] = (
    check_slurm_conf,
    check_hooks,
    check_gres_types,
    check_accounting_tres,
    check_accounting_collector,
    check_energy,
    check_broker,
    check_gres_conf,
    check_node_line,
    check_udev_rules,
    check_udev_loaded,
    check_state_dir,
    check_hooks_import,
    check_slurmd_version,
    check_device_cgroup,
    check_unmanaged_nodes,
    check_gres_plugin,
    check_runtimes,
    check_containers,
    check_munge,
)


def diagnose(node: Node) -> list[Finding]:
    """Every check's findings, in order."""
    return [finding for check in CHECKS for finding in check(node)]


def as_json(findings: list[Finding]) -> dict:
    return {"ok": all(f.ok for f in findings), "findings": [asdict(f) for f in findings]}
