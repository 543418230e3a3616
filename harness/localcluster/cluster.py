"""LocalCluster: configure, start, drive and stop a one-machine Slurm cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_tpu.config import load_config
from slurm_tpu.errors import SlurmCommandError
from slurm_tpu.ops.install import gres_type_names
from slurm_tpu.slurm import installation
from slurm_tpu.slurm.parse import parse_key_values

from .. import module_command
from . import leftovers
from .accounting_db import AccountingDB
from .hardware import apex_cards, detect_under_umockdev, materialize, materialize_sysfs


@dataclass(frozen=True)
class NodeSpec:
    """One compute node: its name and, optionally, a umockdev hardware description."""

    name: str
    umockdev: str | None = None
    cpus: int = 2
    real_memory_mb: int = 1000


@dataclass
class Hooks:
    """Prolog/Epilog/TaskProlog programs (absolute paths) for slurm.conf, and the udev hook."""

    prolog: str | None = None
    epilog: str | None = None
    task_prolog: str | None = None
    health: str | None = None  # HealthCheckProgram
    health_interval: int = 0  # HealthCheckInterval, seconds
    # What the emulated udev runs on a USB stick's remove/add (an installed slurm-tpu-udev-event;
    # default: the shipped one, under the cluster's Python).
    udev: str | None = None


def project_hooks(native: bool = True) -> Hooks:
    """slurm-tpu's Prolog, Epilog and TaskProlog as shipped (a checkout's or the wheel's): their native
    entries where the C client builds (hook_client/slurm-tpu-hook-client.c: what ``slurm-tpu install`` puts
    in slurm.conf then), else, or with ``native=False``, the hooks themselves (Python; sh for the task prolog)."""
    from slurm_tpu.ops.hook_client import build_native, shipped_hook

    entries = build_native() if native else {}

    def pick(name: str) -> str:
        return entries.get(name) or shipped_hook(name)

    return Hooks(
        prolog=pick("slurm-tpu-prolog"), epilog=pick("slurm-tpu-epilog"), task_prolog=pick("slurm-tpu-task-prolog")
    )


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A daemon we started is our child: once it exits it
    stays a zombie (which ``kill(pid, 0)`` still reaches) until we reap it, so reap it
    here. Without this, every stop() waited out its full deadline for daemons that had
    shut down in milliseconds (slurmd logs "Slurmd shutdown completing" ~50 ms after
    SIGTERM)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # it had exited: reaped now
    except ChildProcessError:
        pass  # not our child (started by another process, or already reaped)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rfind(b")") + 2 :][:1] != b"Z"  # another parent's zombie is gone too
    except OSError:
        return False


@dataclass
class LocalCluster:
    """A real slurmctld + ``slurmd -N`` cluster under ``base`` on 127.0.0.1.

    ``hooks`` names Prolog/Epilog/TaskProlog programs; each is wrapped so that it
    runs with ``SLURM_TPU_CONFIG`` pointing at its node's config (state and slot
    directories under the node's own directory), chosen by Slurm's
    ``SLURMD_NODENAME``.
    """

    base: str
    nodes: Sequence[NodeSpec]
    hooks: Hooks = field(default_factory=Hooks)
    name: str = "stpu"
    slurm_conf_extra: Sequence[str] = ()
    node_config_extra: Mapping[str, object] = field(default_factory=dict)
    python: str = sys.executable
    partition_extra: Sequence[str] = ()  # e.g. ("LLN=YES",): appended to the one PartitionName line
    # Which Slurm runs the cluster: a prefix (/opt/slurm-25.11), else SLURM_TPU_SLURM_BIN/SBIN, PATH or /usr.
    slurm_prefix: str | None = None
    # Slurm's FirstJobId. Tests give each cluster its own range: the hooks tell a live job
    # by its `slurmstepd: [<job>.<step>]` processes, so a stray slurmstepd of another
    # cluster on the same machine with the same (small) job id would look like ours.
    first_job_id: int = 1
    # Start the node agent (slurm_tpu/hooks/agent.py) of every node with the daemons; the
    # native entries use it when its socket is there (the C client is built by configure()).
    agents: bool = True
    # One node whose hooks find their config by themselves (installed by `slurm-tpu install
    # --sysconfdir`, which writes its path into them): the node's config is written to this
    # file and slurm.conf names the hooks directly, as on a real node, not per-node wrappers.
    config_file: str | None = None
    # cgroup.conf lines (e.g. ("CgroupPlugin=cgroup/v1", "ConstrainDevices=yes")): when given, the
    # cluster runs task/cgroup + proctrack/cgroup with them; opt-in, the default clusters use none.
    cgroup_conf: Sequence[str] = ()
    # Slurm's own accounting: a private MariaDB + slurmdbd (accounting_db.py), started before
    # slurmctld and stopped with the cluster; `accounting_enforce` is AccountingStorageEnforce.
    accounting: bool = False
    accounting_enforce: str | None = None
    accounting_db: AccountingDB | None = field(default=None, init=False, repr=False)
    # Load our gres/tpu plugin (slurm_plugin/) when one is built for this cluster's Slurm release
    # (slurm_tpu.slurm.gres_plugin): Slurm then hands the hooks SLURM_JOB_TPUS and they ask it nothing.
    # False keeps the plugin-less cluster, whose hooks query the controller for every job.
    gres_plugin: bool = True
    # Start one TPU broker (``python -m slurm_tpu.broker``, slurm_tpu/broker/) per node whose config
    # shares Edge TPUs (families.edgetpu.shared), before its slurmd, and stop it with the node.
    # ``broker_env``: what its libedgetpu needs besides the node's config (the runner tests' double:
    # SLURM_TPU_LIBEDGETPU, EDGETPU_DOUBLE_DEVICES...); EDGETPU_DOUBLE_ROOT defaults to the nodes'
    # simulated /sys and /dev (``%n``: the broker's SLURMD_NODENAME), as the jobs' double is given.
    brokers: bool = True
    broker_env: Mapping[str, str] = field(default_factory=dict)
    # Pyxis + enroot (containers.py): plugstack.conf with the Pyxis of this cluster's Slurm release and
    # a per-node enroot config under the base; ``container_libedgetpu``: the node's libedgetpu the
    # enroot hook binds into containers (tests: the libedgetpu double); ``container_mounts``: more
    # enroot fstab lines for every node (``%N``: the node's directory, ``%n``: its name);
    # ``container_hook``: sh lines every node's enroot runs as a hook before ours (the same %N, %n).
    containers: bool = False
    container_libedgetpu: str = ""
    container_mounts: Sequence[str] = ()
    container_hook: str = ""

    @property
    def slurm(self) -> installation.Installation:
        """The Slurm installation the daemons and client commands come from."""
        if self.slurm_prefix:
            return installation.from_prefix(self.slurm_prefix)
        return installation.find(use_daemons=False)

    @property
    def gres_plugin_dir(self) -> str | None:
        """The directory with our gres_tpu.so this cluster's daemons load, or None (off, or none built)."""
        if not self.gres_plugin:
            return None
        from slurm_tpu.slurm import gres_plugin

        version = installation.version_of(self.slurm.program("slurmd"))
        return gres_plugin.built_for(version) if version else None

    # ---- paths -----------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """A path under the cluster's base directory."""
        return os.path.join(self.base, *parts)

    @property
    def slurm_conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def gres_conf(self) -> str:
        return self.path("etc", "gres.conf")

    def node_dir(self, node: str) -> str:
        """Where a node's simulated devices, slot nodes, state and config live."""
        return self.path("nodes", node)

    def node_config(self, node: str) -> str:
        return self.config_file or os.path.join(self.node_dir(node), "config.yaml")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm client commands talking to this cluster.

        A umockdev preload is never passed on: the daemons and commands must see
        the real machine (slurmd reading a fake sysfs crashes in hwloc).
        """
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "UMOCKDEV_DIR")}
        env["SLURM_CONF"] = self.slurm_conf
        # Clients of the daemons' own release, for a shell and for slurm-tpu's own commands.
        env["PATH"] = ":".join([*self.slurm.dirs, env.get("PATH", "/usr/bin:/bin")])
        env.update(installation.environment(self.slurm))
        env.update(extra or {})
        return env

    @property
    def slurm_tpu(self) -> list[str]:
        """How to run our own CLI from the same Python."""
        return [self.python, "-m", "slurm_tpu.cli"]

    @property
    def udev_hook(self) -> list[str]:
        """How udev runs the udev hook here: ``hooks.udev``, else the shipped ``-I -S`` entry (what the
        installed rules run), under this Python so a wheel install finds the package in its site-packages."""
        from slurm_tpu.ops.node_files import node_file

        if self.hooks.udev:
            return [self.hooks.udev]
        return [self.python, "-I", "-S", node_file("udev", "slurm-tpu-udev-event")]

    def udev_command(self, node: str) -> list[str]:
        """What the node's emulated udev runs: :attr:`udev_hook`, through the node's agent when it runs one
        (the thin client falls back to the Python hook when the agent's socket does not answer)."""
        from slurm_tpu.ops.hook_client import PROGRAM, SOURCE
        from slurm_tpu.ops.node_files import node_file

        client = os.path.join(os.path.dirname(node_file("hook_client", SOURCE)), PROGRAM)
        if self.hooks.udev or not self.agents or not os.access(client, os.X_OK):
            return self.udev_hook
        return [client, "udev", self.state_dir(node), "--", *self.udev_hook]

    def accounting_spool(self, node: str) -> str:
        """The node's accounting spool (its config's ``accounting_spool``), which its collector makes."""
        import yaml

        with open(self.node_config(node), encoding="utf-8") as handle:
            config = yaml.safe_load(handle) or {}
        return config.get("accounting_spool") or os.path.join(self.node_dir(node), "accounting-spool")

    def state_dir(self, node: str) -> str:
        """The node's state directory (its config's ``state_dir:``), where its agent listens."""
        from slurm_tpu.hooks.settings import scan_state_dir

        return scan_state_dir(self.node_config(node))

    # ---- configuration ---------------------------------------------------------
    def configure(self) -> None:
        """Write munge key, per-node hardware and configs, gres.conf and slurm.conf."""
        if self.config_file and len(self.nodes) != 1:
            raise ValueError("config_file serves one node; several nodes need per-node hook wrappers")
        for sub in ("etc", "state", "spool", "log", "run", "munge", "hooks", "nodes"):
            os.makedirs(self.path(sub), mode=0o755, exist_ok=True)
        # Before anything starts: a test suite checks at its end that nothing of it is left.
        leftovers.record(self.base, os.environ.get("PYTEST_CURRENT_TEST", ""))
        os.chmod(self.base, 0o755)
        self._configure_munge()
        for stale in (self.gres_conf, self.path("etc", "nodes.conf")):
            if os.path.exists(stale):
                os.unlink(stale)
        ports = _free_ports(len(self.nodes) + 1)
        self.ctld_port = ports[0]
        minor = 0
        for spec, port in zip(self.nodes, ports[1:]):
            minor = self._configure_node(spec, port, minor)
        with open(self.path("etc", "cluster.json"), "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "ctld_port": self.ctld_port,
                    "nodes": [n.name for n in self.nodes],
                    "slurm_prefix": self.slurm_prefix,
                    "containers": self.containers,  # a slurmd started again keeps its enroot on PATH
                },
                handle,
            )
        self._write_hook_wrappers()
        self._configure_containers()
        self._configure_accounting()
        self._write_slurm_conf()
        if self.agents:
            from slurm_tpu.ops.hook_client import build_native

            build_native()  # the hooks' thin client and native entries, beside them ({}: no cc)

    def _configure_containers(self) -> None:
        """With ``containers``: plugstack.conf and each node's enroot (containers.py)."""
        if not self.containers:
            return
        from . import containers

        version = installation.version_of(self.slurm.program("slurmd"))
        why = containers.missing(version)
        if why:
            raise RuntimeError(why)
        self.plugstack = containers.write_plugstack(self.base, version or "")
        for spec in self.nodes:
            containers.configure_node(
                self.base,
                spec.name,
                self.node_dir(spec.name),
                self.node_config(spec.name),
                self.container_libedgetpu,
                self.python,
                self._source_built_slurm(),
                self.container_mounts,
                self.container_hook,
            )

    def _source_built_slurm(self) -> str | None:
        """The prefix of this cluster's Slurm when it is not the system's (/opt/slurm-25.11), else None."""
        prefix = os.path.dirname(self.slurm.sbin_dir.rstrip("/"))
        return None if prefix in ("/usr", "/", "/usr/local") else prefix

    def _configure_munge(self) -> None:
        key = self.path("munge", "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as handle:
                handle.write(os.urandom(1024))
        shutil.chown(self.path("munge"), "munge", "munge")
        shutil.chown(key, "munge", "munge")
        os.chmod(key, 0o400)
        os.chmod(self.path("munge"), 0o755)  # clients must reach the socket

    def _configure_node(self, spec: NodeSpec, port: int, minor: int) -> int:
        directory = self.node_dir(spec.name)
        if os.path.isdir(directory):
            self._unmount_leftovers(directory)  # an emulated driver's mounts, left by a killed run
            shutil.rmtree(directory)
        os.makedirs(directory, mode=0o755)
        config = {
            "version": 1,
            "node_name": spec.name,
            "devices": {"slot_dir": os.path.join(directory, "slots")},
            "state_dir": os.path.join(directory, "state"),
            "inventory_file": os.path.join(directory, "configured-inventory.json"),
            # Each node its own spool, as on separate machines (the default is one per machine).
            "accounting_spool": os.path.join(directory, "accounting-spool"),
            "sysfs_root": os.path.join(directory, "sys"),  # the hooks' revocation writes here
        }
        for key, value in self.node_config_extra.items():  # e.g. {"devices": {...}} merged shallowly
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}  # type: ignore[dict-item]
            else:
                config[key] = value
        import yaml

        with open(self.node_config(spec.name), "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        inventory_file = os.path.join(directory, "inventory.json")
        if spec.umockdev:
            inventory = detect_under_umockdev(spec.umockdev, self.slurm_tpu, self.python)
            inventory = materialize(inventory, os.path.join(directory, "dev"), minor)
            materialize_sysfs(inventory, os.path.join(directory, "sys"))
            minor += sum(len(a.device_nodes) for a in inventory)
        else:
            from slurm_tpu.hardware import Inventory

            inventory = Inventory()
        with open(inventory_file, "w", encoding="utf-8") as handle:
            json.dump(inventory.to_json(), handle, indent=2)
        env = dict(os.environ, SLURM_TPU_CONFIG=self.node_config(spec.name))
        common = ["--inventory", inventory_file, "--node", spec.name]
        self._run([*self.slurm_tpu, "gres-conf", *common, "--output", self.gres_conf], env)
        self._run(
            [
                *self.slurm_tpu,
                "node-conf",
                *common,
                "--output",
                self.path("etc", "nodes.conf"),
                "--no-hardware",
                "--set",
                f"NodeHostname={socket.gethostname()}",
                "--set",
                "NodeAddr=127.0.0.1",
                "--set",
                f"Port={port}",
                "--set",
                f"CPUs={spec.cpus}",
                "--set",
                f"RealMemory={spec.real_memory_mb}",
            ],
            env,
        )
        return minor

    def _write_hook_wrappers(self) -> None:
        self.hook_paths: dict[str, str] = {}
        for kind in ("prolog", "epilog", "task_prolog", "health"):
            program = getattr(self.hooks, kind)
            if not program:
                continue
            if self.config_file:  # the hooks know their config: name them as a real node would
                self.hook_paths[kind] = program
                continue
            wrapper = self.path("hooks", kind)
            # SLURMD_NODENAME is set by slurmd (not by the job): it picks the node's config.
            with open(wrapper, "w", encoding="utf-8") as handle:
                handle.write(
                    "#!/bin/sh\n"
                    f'SLURM_TPU_CONFIG="{self.path("nodes")}/$SLURMD_NODENAME/config.yaml"\n'
                    f'SLURM_CONF="{self.slurm_conf}"\n'
                    "export SLURM_TPU_CONFIG SLURM_CONF\n"
                    f'exec "{program}" "$@"\n'
                )
            os.chmod(wrapper, 0o755)
            self.hook_paths[kind] = wrapper

    def _write_slurm_conf(self) -> None:
        host = socket.gethostname()
        lines = [
            f"# Generated by harness.localcluster for {self.base}",
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.path('munge', 'munge.socket')}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool')}/%n",
            f"SlurmctldPidFile={self.path('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={self.path('run')}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log')}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *self._task_plugin_lines(),
            "JobAcctGatherType=jobacct_gather/none",
            *(
                self.accounting_db.slurm_conf_lines()
                if self.accounting_db
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.path('log', 'jobcomp.txt')}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            f"GresTypes={','.join(gres_type_names(*(load_config(self.node_config(n.name)) for n in self.nodes)))}",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=600",
            "KillWait=2",
            "SlurmdParameters=config_overrides",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "MessageTimeout=20",
            f"FirstJobId={self.first_job_id}",
        ]
        if "prolog" in self.hook_paths:
            lines.append(f"Prolog={self.hook_paths['prolog']}")
        if "epilog" in self.hook_paths:
            lines.append(f"Epilog={self.hook_paths['epilog']}")
        if "task_prolog" in self.hook_paths:
            lines.append(f"TaskProlog={self.hook_paths['task_prolog']}")
        if "health" in self.hook_paths:
            lines += [
                f"HealthCheckProgram={self.hook_paths['health']}",
                f"HealthCheckInterval={self.hooks.health_interval or 60}",
                "HealthCheckNodeState=ANY",
            ]
        if self.containers:
            lines.append(f"PlugStackConfig={self.path('etc', 'plugstack.conf')}")
        ours = self.gres_plugin_dir
        if ours:
            from slurm_tpu.slurm import gres_plugin

            lines.append(gres_plugin.plugin_dir_line(gres_plugin.slurm_plugin_dir(self.slurm), ours))
        lines += list(self.slurm_conf_extra)
        lines.append(f"Include {self.path('etc', 'nodes.conf')}")
        names = ",".join(n.name for n in self.nodes)
        lines.append(
            " ".join(
                [f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP", *self.partition_extra]
            )
        )
        with open(self.slurm_conf, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")

    def _task_plugin_lines(self) -> list[str]:
        """Process tracking and task plugins, and the cgroup.conf beside slurm.conf when the cluster
        asked for one (slurmd reads ``cgroup.conf`` from slurm.conf's directory)."""
        cgroup_conf = self.path("etc", "cgroup.conf")
        if not self.cgroup_conf:
            if os.path.exists(cgroup_conf):
                os.unlink(cgroup_conf)
            return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]
        with open(cgroup_conf, "w", encoding="utf-8") as handle:
            handle.write("\n".join([f"# Generated by harness.localcluster for {self.base}", *self.cgroup_conf]) + "\n")
        return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"]

    # ---- processes -------------------------------------------------------------
    def _pidfile(self, name: str) -> str:
        return self.path("run", f"{name}.launcher.pid")

    def _spawn(self, name: str, argv: list[str], user: str | None = None, path_first: str | None = None) -> None:
        log = open(self.path("log", f"{name}.out"), "ab")
        # As ``user`` by a plain setgid/setuid in the child, not through runuser: on
        # SIGTERM runuser (util-linux su-common) passes the signal on, then sleeps 2 s
        # before it exits, which made every stop() wait for munged.
        ids = {}
        if user:
            import pwd

            entry = pwd.getpwnam(user)
            ids = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env({"PATH": f"{path_first}:{self.env()['PATH']}"} if path_first else None),
            start_new_session=True,
            close_fds=True,
            **ids,
        )
        log.close()
        with open(self._pidfile(name), "w", encoding="utf-8") as handle:
            handle.write(str(process.pid))

    def running_pids(self) -> dict[str, int]:
        """Daemons this cluster started that are still alive, by name."""
        pids = {}
        run_dir = self.path("run")
        if not os.path.isdir(run_dir):
            return pids
        for entry in os.listdir(run_dir):
            if entry.endswith(".launcher.pid"):
                try:
                    with open(os.path.join(run_dir, entry), encoding="utf-8") as handle:
                        pid = int(handle.read().strip())
                except (OSError, ValueError):
                    continue
                if _pid_alive(pid):
                    pids[entry[: -len(".launcher.pid")]] = pid
        return pids

    def start(self, timeout: float = 90.0) -> None:
        """Start munged, slurmctld and every slurmd; wait until all nodes are up."""
        socket_path = self.path("munge", "munge.socket")
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={socket_path}",
                f"--key-file={self.path('munge', 'munge.key')}",
                f"--pid-file={self.path('munge', 'munged.pid')}",
                f"--log-file={self.path('munge', 'munged.log')}",
                f"--seed-file={self.path('munge', 'munged.seed')}",
            ],
            user="munge",
        )
        self._wait(lambda: os.path.exists(socket_path), 20, "munged did not create its socket")
        if self.accounting_db:  # slurmdbd must answer before slurmctld registers the cluster with it
            self.accounting_db.start(self._spawn, self._wait, self._run)
        self._spawn("slurmctld", [self.slurm.program("slurmctld"), "-D", "-i"])
        slurmd = self.slurm.program("slurmd")
        for spec in self.nodes:
            self._start_apex(spec.name)
            if self.agents:
                self._spawn_agent(spec.name)  # all at once: each imports for a while (many nodes on one host)
            if self.brokers and self.shares_devices(spec.name):
                self._spawn_broker(spec.name)
        for spec in self.nodes:
            self._wait(
                lambda name=spec.name: self._apex_ready(name),
                30,
                f"the emulated apex driver of {spec.name} did not mount",
            )
            if self.agents:
                self._wait_agent(spec.name)
            if self.brokers and self.shares_devices(spec.name):
                self._wait_broker(spec.name)
            self._spawn(f"slurmd-{spec.name}", [slurmd, "-D", "-N", spec.name], path_first=self._node_path(spec.name))
            self._start_usbcore(spec.name)
        self._wait(self._all_nodes_up, timeout, "nodes did not come up")

    # ---- accounting ------------------------------------------------------------

    def _configure_accounting(self) -> None:
        """With ``accounting``: the private MariaDB + slurmdbd and the TRES the nodes' GRES need."""
        if not self.accounting:
            return
        from slurm_tpu.render.node_conf import accounting_tres_of_nodes_conf

        from .accounting_db import DEFAULT_ENFORCE

        with open(self.path("etc", "nodes.conf"), encoding="utf-8") as handle:
            tres = accounting_tres_of_nodes_conf(handle.read())
        self.accounting_db = AccountingDB(
            self.base,
            self.name,
            self.path("munge", "munge.socket"),
            self.slurm.program("slurmdbd"),
            enforce=self.accounting_enforce or DEFAULT_ENFORCE,
            tres=tres,
        )
        self.accounting_db.configure()

    def sacctmgr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``sacctmgr -i ARGS`` as root (no prompt), against this cluster's slurmdbd."""
        return self.command(["sacctmgr", "-i", *args], check=check)

    def add_accounting_users(self, users: Sequence[str], account: str = "stpu", timeout: float = 60) -> None:
        """Give ``users`` an association (``account`` under root) and wait until slurmctld has them.

        Without one, enforcement refuses their jobs. sacctmgr's changes reach the
        controller asynchronously from slurmdbd, so this waits on the controller's
        own view (``scontrol show assoc_mgr``), not on sacctmgr's exit.
        """
        if not self.sacctmgr("-n", "-P", "show", "account", account, "format=account").stdout.strip():
            self.sacctmgr(
                "add", "account", account, f"cluster={self.name}", "description=slurm-tpu", "organization=slurm-tpu"
            )
        # check=False: sacctmgr exits 1 with "Nothing new added" when they all have one already.
        self.sacctmgr(
            "add", "user", f"names={','.join(users)}", f"account={account}", f"cluster={self.name}", check=False
        )
        self._wait(
            lambda: all(self.controller_association(u) for u in users),
            timeout,
            f"slurmctld did not learn the associations of {', '.join(users)}",
        )

    def controller_association(self, user: str) -> str:
        """slurmctld's record of ``user``'s association (``scontrol -o show assoc_mgr``), '' if it has none."""
        out = self.command(["scontrol", "-o", "show", "assoc_mgr", "flags=assoc"], check=False).stdout
        return next((line for line in out.splitlines() if f"UserName={user}(" in line), "")

    def stop_slurmdbd(self) -> None:
        """Stop the accounting daemon (slurmctld queues its records until it is back)."""
        self._stop_daemon("slurmdbd")

    def start_slurmdbd(self) -> None:
        """Start the accounting daemon again; return once it listens."""
        from .accounting_db import _port_answers

        assert self.accounting_db is not None, "a cluster without accounting has no slurmdbd"
        self._spawn("slurmdbd", [self.accounting_db.slurmdbd, "-D"])
        self._wait(lambda: _port_answers(self.accounting_db.dbd_port), 90, "slurmdbd did not listen")

    def apex_cards(self, node: str) -> list[str]:
        """The node's PCIe Edge TPU nodes (from its materialized inventory)."""
        from slurm_tpu.families import inventory_from_json

        try:
            with open(os.path.join(self.node_dir(node), "inventory.json"), encoding="utf-8") as handle:
                return apex_cards(inventory_from_json(json.load(handle)))
        except FileNotFoundError:
            return []

    def _start_apex(self, node: str) -> None:
        """The emulated apex driver (apex.py) for a node with PCIe Edge TPUs: pty nodes, a live write_open_count.

        Stopped with the other daemons; it unmounts what it mounted, and stop()
        detaches whatever a killed one left.
        """
        cards = self.apex_cards(node)
        if cards:
            self._spawn(
                f"apex-{node}",
                module_command(
                    self.python, "harness.localcluster.apex", os.path.join(self.node_dir(node), "sys"), *cards
                ),
            )

    def _apex_ready(self, node: str) -> bool:
        if not self.apex_cards(node):
            return True
        if "apex-" + node not in self.running_pids():
            raise RuntimeError(f"the emulated apex driver of {node} exited; see {self.path('log', f'apex-{node}.out')}")
        return os.path.ismount(os.path.join(self.node_dir(node), "sys", "class", "apex"))

    def agent_socket(self, node: str) -> str:
        """The node agent's socket (slurm_tpu/hooks/agent.py)."""
        from slurm_tpu.hooks.agent import SOCKET

        return os.path.join(self.state_dir(node), SOCKET)

    def start_agent(self, node: str, timeout: float = 60) -> None:
        """Start the node's agent (root, its own config) and wait until it listens.

        It is started before the node's slurmd, so no hook runs before it; a stale
        socket (a killed agent's) is replaced by the new agent, never waited on.
        """
        self._spawn_agent(node)
        self._wait_agent(node, timeout)

    def _spawn_agent(self, node: str) -> None:
        from slurm_tpu.ops.node_files import node_file

        self._spawn(
            f"agent-{node}",
            [
                "env",
                f"SLURM_TPU_CONFIG={self.node_config(node)}",
                f"SLURMD_NODENAME={node}",
                self.python,
                "-I",
                "-S",
                node_file("systemd", "slurm-tpu-agent"),
            ],
        )

    def _wait_agent(self, node: str, timeout: float = 60) -> None:
        from slurm_tpu.hooks.agent import PIDFILE

        socket_path = self.agent_socket(node)
        pidfile = os.path.join(self.state_dir(node), PIDFILE)

        def listening() -> bool:
            pid = self.running_pids().get(f"agent-{node}")
            if pid is None:
                raise RuntimeError(f"the agent of {node} exited; see {self.path('log', f'agent-{node}.out')}")
            try:  # `env` exec'ed the agent: the launcher's pid is the agent's, and it writes it once it listens
                with open(pidfile, encoding="ascii") as handle:
                    return handle.read().strip() == str(pid)
            except (FileNotFoundError, ValueError):
                return False

        self._wait(listening, timeout, f"the agent of {node} did not listen on {socket_path}")

    def stop_agent(self, node: str) -> None:
        """Stop the node's agent (SIGTERM: it removes its socket, and the hooks run the Python hooks)."""
        self._stop_daemon(f"agent-{node}")

    # ---- the TPU broker (slurm_tpu/broker/) ---------------------------------------

    def shares_devices(self, node: str) -> bool:
        """Whether the node has an Edge TPU its config shares (families.edgetpu.shared): then it runs a
        broker. One config may name every node's shared devices: a node without them runs none."""
        from slurm_tpu.config import load_config
        from slurm_tpu.families import inventory_from_json
        from slurm_tpu.render.gres_conf import shared_devices

        with open(os.path.join(self.node_dir(node), "inventory.json"), encoding="utf-8") as handle:
            inventory = inventory_from_json(json.load(handle))
        shared = shared_devices(inventory, load_config(self.node_config(node)))
        return any(item.accelerator.kind == "edgetpu" for item in shared)

    def broker_socket(self, node: str) -> str:
        """The node's broker's control socket (protocol/broker_wire.py)."""
        from slurm_tpu.protocol.broker_wire import control_path

        return control_path(self.state_dir(node))

    def start_broker(self, node: str, timeout: float = 60) -> None:
        """Start the node's broker (root, its own config) and wait until its control socket listens."""
        self._spawn_broker(node)
        self._wait_broker(node, timeout)

    def _spawn_broker(self, node: str) -> None:
        environment = {"EDGETPU_DOUBLE_ROOT": os.path.join(self.path("nodes"), "%n"), **self.broker_env}
        self._spawn(
            f"broker-{node}",
            [
                "env",
                f"SLURM_TPU_CONFIG={self.node_config(node)}",
                f"SLURMD_NODENAME={node}",
                *(f"{key}={value}" for key, value in environment.items()),
                self.python,
                "-m",
                "slurm_tpu.broker",
            ],
        )

    def _wait_broker(self, node: str, timeout: float = 60) -> None:
        from slurm_tpu.protocol.broker_wire import BROKER_DIR, PIDFILE

        pidfile = os.path.join(self.state_dir(node), BROKER_DIR, PIDFILE)

        def listening() -> bool:
            pid = self.running_pids().get(f"broker-{node}")
            if pid is None:
                raise RuntimeError(f"the broker of {node} exited; see {self.path('log', f'broker-{node}.out')}")
            try:  # `env` exec'ed the broker: the launcher's pid is the broker's, written once its socket listens
                with open(pidfile, encoding="ascii") as handle:
                    return handle.read().strip() == str(pid)
            except (FileNotFoundError, ValueError):
                return False

        self._wait(listening, timeout, f"the broker of {node} did not listen on {self.broker_socket(node)}")

    def stop_broker(self, node: str) -> None:
        """Stop the node's broker (SIGTERM)."""
        self._stop_daemon(f"broker-{node}")

    def kill_broker(self, node: str) -> None:
        """Kill the node's broker (SIGKILL, no clean-up: a crash), and wait until it is gone."""
        pid = self.running_pids().get(f"broker-{node}")
        if not pid:
            return
        os.killpg(pid, signal.SIGKILL)
        self._wait(lambda: not _pid_alive(pid), 15, f"the broker of {node} (pid {pid}) did not die")

    def _start_usbcore(self, node: str) -> None:
        """The emulated USB core (usbcore.py) for a node with USB Edge TPUs: the kernel's side of revocation."""
        directory = self.node_dir(node)
        if not os.path.isdir(os.path.join(directory, "sys", "bus", "usb", "devices")):
            return
        self._spawn(
            f"usbcore-{node}",
            [
                "env",
                f"SLURM_TPU_CONFIG={self.node_config(node)}",
                f"SLURMD_NODENAME={node}",
                *module_command(
                    self.python,
                    "harness.localcluster.usbcore",
                    os.path.join(directory, "sys"),
                    os.path.join(directory, "dev"),
                    "--",
                    *self.udev_command(node),
                ),
            ],
        )

    @classmethod
    def load(cls, base: str) -> LocalCluster:
        """The cluster configured earlier under ``base`` (for stop/restart from another process)."""
        with open(os.path.join(base, "etc", "cluster.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
        cluster = cls(
            base=base,
            nodes=[NodeSpec(name) for name in saved["nodes"]],
            slurm_prefix=saved.get("slurm_prefix"),
            containers=bool(saved.get("containers")),
        )
        cluster.ctld_port = saved["ctld_port"]
        return cluster

    def _stop_daemon(self, name: str) -> None:
        pid = self.running_pids().get(name)
        if not pid:
            return
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)

    def stop_slurmd(self, node: str) -> None:
        """Stop one node's slurmd."""
        self._stop_daemon(f"slurmd-{node}")

    def start_slurmd(self, node: str) -> None:
        """Start one node's slurmd (no wait: the controller may be restarting)."""
        self._spawn(
            f"slurmd-{node}", [self.slurm.program("slurmd"), "-D", "-N", node], path_first=self._node_path(node)
        )

    def _node_path(self, node: str) -> str | None:
        """What goes first on the node's slurmd PATH: its enroot wrapper's directory (containers), else nothing."""
        if not self.containers:
            return None
        return os.path.join(self.node_dir(node), "enroot", "bin")

    def restart_slurmctld(self, timeout: float = 60) -> None:
        """Restart the controller (it re-reads slurm.conf, new GRES counts included)."""
        self._stop_daemon("slurmctld")
        self._spawn("slurmctld", [self.slurm.program("slurmctld"), "-D"])
        self._wait(
            lambda: self._run(["scontrol", "ping"], check=False, timeout=10).returncode == 0,
            timeout,
            "slurmctld did not come back",
        )

    def _all_nodes_up(self) -> bool:
        try:
            states = self.node_states()
        except RuntimeError:
            return False
        return len(states) == len(self.nodes) and all(
            s.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED") for s in states.values()
        )

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} within {timeout:g} s; see logs in {self.path('log')}")

    def stop(self) -> None:
        """Stop every daemon this cluster started (by its recorded pid), then every process left of it.

        What is left are job steps: slurmstepd runs in a session of its own and
        outlives slurmd (see leftovers.py), with its job's processes; they are
        found by the paths under ``base`` they name and killed, so a stopped
        cluster leaves no process behind whatever state its jobs were in.
        """
        pids = self.running_pids()
        # slurmd first (no new hooks), agents and brokers after it, munge last.
        order = sorted(pids, key=lambda n: (n == "munged", n == "slurmctld", n.startswith(("agent-", "broker-"))))
        for name in order:
            try:
                os.killpg(pids[name], signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids.values()):
            time.sleep(0.2)
        for pid in pids.values():
            if _pid_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in pids:
            try:
                os.unlink(self._pidfile(name))
            except OSError:
                pass
        try:
            leftovers.end_processes_of([self.base])
        finally:
            self._unmount_leftovers()
            self._remove_cgroups()

    def _remove_cgroups(self, root: str = "/sys/fs/cgroup") -> None:
        """Remove the empty cgroup v1 directories slurmd made for this cluster's nodes (``slurm_<node>``,
        with task/cgroup only). rmdir() refuses a cgroup that still has a process or a child, so
        nothing in use is touched, whoever uses it."""
        if not os.path.exists(self.path("etc", "cgroup.conf")):
            return
        for controller in os.listdir(root) if os.path.isdir(root) else []:
            for spec in self.nodes:
                top = os.path.join(root, controller, f"slurm_{spec.name}")
                if not os.path.isdir(top) or os.path.islink(top):
                    continue
                for directory, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):
                    try:
                        os.rmdir(directory)
                    except OSError:
                        pass

    def _unmount_leftovers(self, under: str | None = None) -> None:
        """Detach mounts under the base, or ``under`` (jobs' usage boxes whose epilog never ran, an
        emulated apex driver's nodes and attribute after it was killed)."""
        prefix = (under or self.base).rstrip("/") + "/"
        try:
            with open("/proc/self/mounts", encoding="utf-8") as handle:
                points = [line.split()[1] for line in handle if len(line.split()) > 1]
        except OSError:
            return
        for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)

    # ---- driving ---------------------------------------------------------------
    def _run(
        self,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        if "/" not in argv[0]:  # sbatch, scontrol...: the cluster's own release
            try:
                argv = [self.slurm.program(argv[0]), *argv[1:]]
            except SlurmCommandError:
                pass  # not one of Slurm's programs: found on PATH
        if user:
            argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.slurm_conf}", *argv]
        completed = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=dict(env or self.env()),
            timeout=timeout,
            check=False,
            input=input,
            cwd="/",
        )
        if check and completed.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({completed.returncode}): {(completed.stderr or completed.stdout).strip()}"
            )
        return completed

    def command(
        self,
        argv: Sequence[str],
        user: str | None = None,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, scontrol, ...) against this cluster."""
        return self._run(list(argv), user=user, check=check, timeout=timeout, input=input)

    def sbatch(self, args: Sequence[str], script: str, user: str | None = None) -> int:
        """Submit ``script`` (text) with ``args``; return the job id."""
        out = self.command(["sbatch", "--parsable", "--chdir=/tmp", *args], user=user, input=script).stdout
        return int(out.strip().split(";")[0])

    def node_states(self) -> dict[str, str]:
        """Node name -> state (``IDLE``, ``DOWN+DRAIN``...) from scontrol."""
        out = self._run(["scontrol", "-o", "show", "node"], check=False, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        states = {}
        for line in out.stdout.splitlines():
            fields = parse_key_values(line)
            if "NodeName" in fields:
                states[fields["NodeName"]] = fields.get("State", "")
        return states

    def show_node(self, node: str) -> str:
        """``scontrol show node`` text of one node."""
        return self.command(["scontrol", "show", "node", node]).stdout

    def job_state(self, job_id: int) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED...), '' if unknown."""
        out = self.command(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        return parse_key_values(out.stdout).get("JobState", "")

    def wait_for_jobs(self, job_ids: Sequence[int], timeout: float = 120) -> dict[int, str]:
        """Wait until every job has finished; return their final states."""
        final = (
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
        )
        deadline = time.monotonic() + timeout
        states: dict[int, str] = {}
        while time.monotonic() < deadline:
            states = {job: self.job_state(job) for job in job_ids}
            if all(s in final for s in states.values()):
                self.wait_for_releases(timeout=max(deadline - time.monotonic(), 30))
                return states
            time.sleep(0.5)
        raise RuntimeError(f"jobs not finished within {timeout:g} s: {states}")

    def wait_for_releases(self, nodes: Sequence[str] | None = None, timeout: float = 60) -> None:
        """Wait until no node's epilog is still releasing devices after it answered Slurm.

        With the node agent, the epilog answers as soon as it holds the node's state lock
        and releases under it (slurm_tpu/hooks/epilog.py), so a job Slurm reports ended
        may have its release still running for some milliseconds. The events to wait for:
        that lock taken once (whatever the epilog did under it has been done), with no
        lease left in phase ``releasing`` (a scan for holders runs without the lock,
        slurm_tpu/hooks/leasing.py end_lease).
        """
        import fcntl

        from slurm_tpu.access.ledger import LOCK, RELEASING, Lease, Ledger

        deadline = time.monotonic() + timeout
        for node in nodes or [n.name for n in self.nodes]:
            try:
                fd = os.open(os.path.join(self.state_dir(node), LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # nothing was ever leased on this node
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        what = "its state lock still held"
                    else:
                        with Ledger(self.state_dir(node), create=False) as ledger:
                            releasing = [
                                lease.identity
                                for lease in ledger.all()
                                if isinstance(lease, Lease) and lease.phase == RELEASING
                            ]
                        fcntl.flock(fd, fcntl.LOCK_UN)
                        if not releasing:
                            break
                        what = f"{', '.join(releasing)} still releasing"
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{node}: {what} after {timeout:g} s")
                    time.sleep(0.01)
            finally:
                os.close(fd)
