"""The whole node install from a built wheel: pip install, slurm-tpu install, a real cluster, doctor.

One module-wide set-up, as an admin would do it: build the sdist and, from it, the
wheel; install the wheel (with ``[infer]``) into a fresh venv under /tmp, outside
the repository; run that venv's ``slurm-tpu install --prefix P --sysconfdir P/etc``;
start a real one-node Slurm cluster (munge, slurmctld, slurmd) whose slurm.conf
names the hooks in ``P/libexec/slurm-tpu`` directly, configured by the installed
package's own gres-conf/node-conf. Then: a job gets its Edge TPU and loses it,
``doctor`` passes, and each broken set-up fails exactly the check that names it.
The last test removes LiteRT from the venv (so it runs last).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import pytest

from helpers import REPO, real_libedgetpu, require_root_and
from slurm_tpu.config import Config
from slurm_tpu.ops.install import gres_types

# Every registered family's GRES name (tpu,gpu,...): what install and the test cluster write.
GRES_TYPES = gres_types(Config())

pytestmark = pytest.mark.slurm
NODE = "n1"
SHIPPED = (
    "prolog/slurm-tpu-prolog",
    "prolog/slurm-tpu-task-prolog",
    "udev/slurm-tpu-udev-event",
    "epilog/slurm-tpu-epilog",
    "systemd/slurm-tpu-agent",
    "systemd/slurm-tpu-broker",
    "hook_client/slurm-tpu-hook-client.c",
    "slurm_conf/slurm.conf.snippet",
    "systemd/slurm-tpu-agent.service",
    "systemd/slurm-tpu-broker.service",
    "systemd/slurm-tpu-watch.service",
    "systemd/slurm-tpu-metrics.service",
    "systemd/slurm-tpu-metrics.timer",
    "systemd/slurm-tpu-accounting.service",
    "systemd/slurm-tpu-accounting.timer",
    "systemd/slurmd-slurm-tpu.conf",
)

# Built in a checkout (slurm_tpu/ops/hook_client.py), on each node again: never in the sdist or the wheel.
BUILT_HERE = ("/slurm-tpu-hook-client", "-native")


def run(argv: list[str], env: dict | None = None, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}\n{done.stderr}"
    return done


class Node:
    """The installed node: venv, prefix, cluster."""

    def __init__(self, work: str):
        self.work = work
        self.dist = os.path.join(work, "dist")
        self.venv = os.path.join(work, "venv")
        self.prefix = os.path.join(work, "prefix")
        self.sysconfdir = os.path.join(self.prefix, "etc")
        self.cluster = None

    @property
    def python(self) -> str:
        return os.path.join(self.venv, "bin", "python")

    @property
    def slurm_tpu(self) -> str:
        return os.path.join(self.venv, "bin", "slurm-tpu")

    @property
    def hooks_dir(self) -> str:
        return os.path.join(self.prefix, "libexec", "slurm-tpu")

    def hook(self, name: str) -> str:
        return os.path.join(self.hooks_dir, name)

    def env(self, **extra: str) -> dict[str, str]:
        env = self.cluster.env() if self.cluster else dict(os.environ)
        env.pop("SLURM_TPU_CONFIG", None)
        env.pop("SLURM_TPU_LIBEDGETPU", None)
        env.update(extra)
        return env

    def doctor(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        argv = [
            self.slurm_tpu,
            "doctor",
            "--prefix",
            self.prefix,
            "--sysconfdir",
            self.sysconfdir,
            "--slurm-conf",
            self.cluster.slurm_conf,
            "--inventory",
            os.path.join(self.cluster.node_dir(NODE), "inventory.json"),
            *args,
        ]
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            env=self.env(**{"SLURM_TPU_LIBEDGETPU": real_libedgetpu(), **env}),
        )


def build_wheel(dist: str) -> tuple[str, str]:
    """(sdist, wheel): the sdist from the checkout, the wheel built from the sdist alone."""
    os.makedirs(dist)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({dist!r}))"
    sdist = os.path.join(dist, run([sys.executable, "-c", code], cwd=REPO).stdout.strip().splitlines()[-1])
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, sdist], cwd=dist)
    wheels = [name for name in os.listdir(dist) if name.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return sdist, os.path.join(dist, wheels[0])


@pytest.fixture(scope="module")
def node(users):
    require_root_and(("slurmctld", "slurmd", "munged", "umockdev-run"), "a real cluster")
    from support import HARDWARE, finish_cluster, make_cluster

    from harness.localcluster.cluster import Hooks, NodeSpec

    work = tempfile.mkdtemp(prefix="slurm-tpu-wheel-", dir="/tmp")
    os.chmod(work, 0o755)
    setup = Node(work)
    setup.sdist, setup.wheel = build_wheel(setup.dist)
    run(["/usr/bin/python3", "-m", "venv", setup.venv])
    run([setup.python, "-m", "pip", "install", "-q", f"{setup.wheel}[infer]"], timeout=600)
    os.mkdir(setup.prefix, 0o755)
    install = [setup.slurm_tpu, "install", "--prefix", setup.prefix, "--sysconfdir", setup.sysconfdir]
    # Before the cluster exists: no slurm.conf yet (and not another test's running one).
    setup.first_install = run(
        [*install, "--slurm-conf", os.path.join(work, "none", "slurm.conf")], env=setup.env(), cwd="/"
    ).stdout
    # The emulated udev runs the installed udev hook, as the installed rules name it.
    hooks = Hooks(
        prolog=setup.hook("slurm-tpu-prolog"),
        epilog=setup.hook("slurm-tpu-epilog"),
        task_prolog=setup.hook("slurm-tpu-task-prolog"),
        udev=setup.hook("slurm-tpu-udev-event"),
    )
    # HealthCheckProgram named, but never run (interval 0): `slurm-tpu health` would look at
    # this machine's real udev, where the node's umockdev TPU does not exist, and drain it.
    setup.cluster = make_cluster(
        [NodeSpec(NODE, os.path.join(HARDWARE, "n4_one_tpu.umockdev"))],
        hooks=hooks,
        python=setup.python,
        config_file=os.path.join(setup.sysconfdir, "slurm-tpu", "config.yaml"),
        slurm_conf_extra=(f"HealthCheckProgram={setup.hook('slurm-tpu-health')}",),
    )
    # As an admin would, once slurm.conf exists: install again, naming it (the watcher's
    # unit takes gres.conf's directory from it; install checks the lines are there).
    run([*install, "--slurm-conf", setup.cluster.slurm_conf], env=setup.env(), cwd="/")
    yield setup
    finish_cluster(setup.cluster)
    if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
        shutil.rmtree(work, ignore_errors=True)


# ---- the package --------------------------------------------------------------------------


def test_sdist_and_wheel_carry_the_node_files_byte_for_byte(node):
    with tarfile.open(node.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        for name in SHIPPED:
            with open(os.path.join(REPO, name), "rb") as handle:
                assert sdist.extractfile(f"{top}/{name}").read() == handle.read(), name
        # The test and demo harness stays in the checkout.
        assert not [name for name in sdist.getnames() if name.startswith(f"{top}/harness")]
        # So does what was built here (the hook client, the native entries beside the hooks).
        assert not [name for name in sdist.getnames() if name.endswith(BUILT_HERE)]
    with zipfile.ZipFile(node.wheel) as wheel:
        for name in SHIPPED:
            with open(os.path.join(REPO, name), "rb") as handle:
                assert wheel.read(f"slurm_tpu/node_files/{name}") == handle.read(), name
        assert not [name for name in wheel.namelist() if name.startswith("harness") or name.endswith(BUILT_HERE)]
    site = run(
        [node.python, "-c", "import slurm_tpu, os; print(os.path.dirname(slurm_tpu.__file__))"], cwd="/"
    ).stdout.strip()
    assert site.startswith(node.venv)  # the wheel's package, not the checkout's


def test_installed_hooks_are_roots_and_import_from_the_venv_without_site(node):
    for name, mode in (
        ("slurm-tpu-prolog", 0o755),
        ("slurm-tpu-task-prolog", 0o755),
        ("slurm-tpu-udev-event", 0o755),
        ("slurm-tpu-epilog", 0o755),
        ("slurm-tpu-agent", 0o755),
        ("slurm-tpu-health", 0o755),
    ):
        info = os.lstat(node.hook(name))
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, mode), name
    for name in ("slurm-tpu-prolog", "slurm-tpu-epilog", "slurm-tpu-udev-event", "slurm-tpu-agent"):
        with open(node.hook(name), encoding="utf-8") as handle:
            assert handle.readline() == f"#!{node.python} -IS\n", name
    # The entry point's own lines, run as Slurm would run it but stopping before main():
    # slurm_tpu comes from the venv, and neither site nor any third-party module is loaded.
    with open(node.hook("slurm-tpu-epilog"), encoding="utf-8") as handle:
        head = handle.read().split("try:")[0]
    probe = head + (
        "import slurm_tpu.hooks.epilog, slurm_tpu.hooks.prolog\n"
        "print(slurm_tpu.__file__)\n"
        "print(sorted(m for m in ('site', 'yaml', 'click', 'pyudev', 'numpy') if m in sys.modules))\n"
    )
    out = run([node.python, "-I", "-S", "-c", probe], cwd="/").stdout.splitlines()
    assert out[0].startswith(node.venv) and out[1] == "[]"


def test_first_install_prints_the_slurm_conf_lines_to_add(node):
    out = node.first_install
    assert "Add to " in out
    for line in (
        f"Prolog={node.hook('slurm-tpu-prolog')}",
        f"Epilog={node.hook('slurm-tpu-epilog')}",
        f"TaskProlog={node.hook('slurm-tpu-task-prolog')}",
        f"HealthCheckProgram={node.hook('slurm-tpu-health')}",
        f"GresTypes={GRES_TYPES}",
    ):
        assert f"  {line}\n" in out, line
    # The hooks themselves, not their native entries: those read /etc/slurm-tpu/config.yaml, not P/etc's.
    assert "native entries not installed: " in out


def test_the_installed_udev_rules_run_the_installed_udev_hook(node):
    with open(os.path.join(node.sysconfdir, "udev", "rules.d", "60-slurm-tpu.rules"), encoding="utf-8") as handle:
        installed = handle.read()
    runs = {line.split('RUN+="', 1)[1].rstrip('"') for line in installed.splitlines() if 'RUN+="' in line}
    assert runs == {node.hook("slurm-tpu-udev-event")}
    # What `slurm-tpu udev-rules` renders for that prefix and config is the installed file, byte for byte.
    rendered = run(
        [
            node.slurm_tpu,
            "--config",
            os.path.join(node.sysconfdir, "slurm-tpu", "config.yaml"),
            "udev-rules",
            "--prefix",
            node.prefix,
        ],
        env=node.env(),
        cwd="/",
    ).stdout
    assert rendered == installed


def test_install_again_changes_nothing(node):
    before = tree(node.prefix)
    out = run(
        [
            node.slurm_tpu,
            "install",
            "--prefix",
            node.prefix,
            "--sysconfdir",
            node.sysconfdir,
            "--slurm-conf",
            node.cluster.slurm_conf,
        ],
        env=node.env(),
        cwd="/",
    ).stdout
    assert not [line for line in out.splitlines() if line.startswith(("write", "replace", "create", "fix"))], out
    assert tree(node.prefix) == before
    # The cluster's slurm.conf names the hooks and has GresTypes; it runs no health check
    # (see the fixture), so only those lines are still to add.
    to_add = [
        line.strip() for line in out.split("then `scontrol reconfigure`:\n")[1].splitlines() if line.startswith("  ")
    ]
    assert to_add == ["HealthCheckInterval=60", "HealthCheckNodeState=ANY"]


# ---- a job on the installed node --------------------------------------------------------------

JOB = """#!/bin/sh
echo "$SLURM_TPU_DEVICES" > {out}/devices
python3 -I -c '
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK)); print("OPENED")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
' {device} > {out}/probe
"""


def test_tpu_job_gets_its_device_and_loses_it_at_the_end(node, users):
    from support import inventory, open_as, owner

    cluster = node.cluster
    device = inventory(cluster, NODE)["usb-2-1.3"][0]
    out = os.path.join(cluster.base, "out")
    assert owner(device) == (0, 0, 0o600) and open_as("stpu_alice", device) == "EACCES"
    job = cluster.sbatch(
        ["--gres=tpu:1", "-o", "/dev/null", "-e", os.path.join(out, "err")],
        JOB.format(out=out, device=device),
        user="stpu_alice",
    )
    assert cluster.wait_for_jobs([job])[job] == "COMPLETED"
    with open(os.path.join(out, "devices"), encoding="utf-8") as handle:
        assert handle.read().strip() == "usb-2-1.3"  # the installed task-prolog's export
    with open(os.path.join(out, "probe"), encoding="utf-8") as handle:
        assert handle.read().strip() == "ENXIO"  # permitted (no driver behind the fake node)
    # The installed epilog revoked the stick (port power-cycled): it comes back as a
    # new node, which the installed udev hook gives to the idle owner.
    device = inventory(cluster, NODE)["usb-2-1.3"][0]
    assert owner(device) == (0, 0, 0o600)
    assert open_as("stpu_alice", device) == "EACCES"


# ---- doctor ---------------------------------------------------------------------------------------


def failures(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("FAIL")]


def test_doctor_passes_on_the_installed_node(node):
    done = node.doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert failures(done) == []
    checks = {line.split(":")[0].split(None, 1)[1] for line in done.stdout.splitlines() if line.startswith("ok")}
    assert checks == {
        "slurm.conf",
        "hooks",
        "GresTypes",
        "AccountingStorageTRES",
        "accounting collector",
        "gres.conf",
        "NodeName",
        "udev rules",
        "udev loaded",
        "state dir",
        "hooks import",
        "slurmd",
        "device cgroup",
        "device nodes",
        "gres plugin",
        "libedgetpu",
        "EDGETPU_VISIBLE_DEVICES",
        "TFLite runtime",
        "munge",
        "tpu broker",  # this node shares no TPU: "not needed"
        "node energy",  # the local cluster's slurm.conf sets no AcctGatherEnergyType: said, never a failure
        "device energy",
        "rootful containers",  # no users-writable rootful Podman/Docker socket here
        "CDI",  # the node leases devices and has no CDI spec of ours: said, never a failure
    }
    assert "ok    node energy: Slurm collects no node energy here" in done.stdout
    as_json = node.doctor("--json")
    assert as_json.returncode == 0 and '"ok": true' in as_json.stdout


@contextlib.contextmanager
def edited(path: str, old: str, new: str):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    assert old in text, f"{old!r} not in {path}"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new))
    try:
        yield
    finally:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


@contextlib.contextmanager
def moved(path: str):
    os.rename(path, path + ".away")
    try:
        yield
    finally:
        os.rename(path + ".away", path)


@contextlib.contextmanager
def chmodded(path: str, mode: int):
    old = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, mode)
    try:
        yield
    finally:
        os.chmod(path, old)


@contextlib.contextmanager
def together(*contexts):
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


@contextlib.contextmanager
def accounting_timer_enabled(node):
    """The collector's timer enabled, as ``systemctl enable`` does it: a link in timers.target.wants."""
    units = os.path.join(node.sysconfdir, "systemd", "system")
    link = os.path.join(units, "timers.target.wants", "slurm-tpu-accounting.timer")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.join(units, "slurm-tpu-accounting.timer"), link)
    try:
        yield
    finally:
        os.unlink(link)


def untested_slurmd(work: str) -> str:
    """A directory whose slurmd says it is Slurm 23.02.7 (only ``-V``).

    A stand-in at the one boundary that cannot be real here: a third Slurm release.
    """
    directory = os.path.join(work, "slurm-23.02", "sbin")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "slurmd")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('#!/bin/sh\n[ "$1" = -V ] && echo "slurm 23.02.7"\n')
    os.chmod(path, 0o755)
    return directory


def corals_own(work: str) -> str:
    """A libedgetpu that ignores EDGETPU_VISIBLE_DEVICES, as Coral's own build does (the test double)."""
    from edgetpu_double.build import build_double

    directory = os.path.join(work, "coral")
    os.makedirs(directory, exist_ok=True)
    return str(build_double(directory, ignores_visible=True))


def broken(node, case: str):
    """(what breaks the node, extra doctor environment) for one broken set-up."""
    cluster = node.cluster
    state = os.path.join(cluster.node_dir(NODE), "state")
    device = None
    if case == "udev rules not loaded":
        from support import inventory

        device = inventory(cluster, NODE)["usb-2-1.3"][0]
    with open(node.hook("slurm-tpu-prolog"), encoding="utf-8") as handle:
        root_line = next(line for line in handle if line.startswith("_ROOT = "))
    return {
        "hook missing": (moved(node.hook("slurm-tpu-epilog")), {}),
        "hook world-writable": (chmodded(node.hook("slurm-tpu-prolog"), 0o777), {}),
        "GresTypes lacking tpu": (
            edited(cluster.slurm_conf, f"GresTypes={GRES_TYPES}", f"GresTypes={GRES_TYPES.replace('tpu,', '')}"),
            {},
        ),
        "AccountingStorageTRES lacking the type": (
            together(
                edited(
                    cluster.slurm_conf,
                    "AccountingStorageType=accounting_storage/none",
                    "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/tpu",
                ),
                accounting_timer_enabled(node),
            ),
            {},
        ),
        "accounting timer not enabled": (
            edited(
                cluster.slurm_conf,
                "AccountingStorageType=accounting_storage/none",
                "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/tpu,gres/tpu:edgetpu_usb",
            ),
            {},
        ),
        "accounting unit stale": (
            together(
                edited(
                    cluster.slurm_conf,
                    "AccountingStorageType=accounting_storage/none",
                    "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/tpu,gres/tpu:edgetpu_usb",
                ),
                edited(
                    os.path.join(node.sysconfdir, "systemd", "system", "slurm-tpu-accounting.service"),
                    " accounting-collect",
                    " accounting-collect --every 60",
                ),
                accounting_timer_enabled(node),
            ),
            {},
        ),
        "gres.conf stale": (edited(cluster.gres_conf, "Type=edgetpu_usb", "Type=edgetpu_pci"), {}),
        "udev rules not loaded": (chmodded(device, 0o666) if device else None, {}),
        "state dir wrong mode": (chmodded(state, 0o777), {}),
        "slurmd untested version": (contextlib.nullcontext(), {"SLURM_TPU_SLURM_SBIN": untested_slurmd(node.work)}),
        "udev rules not installed": (moved(os.path.join(node.sysconfdir, "udev", "rules.d", "60-slurm-tpu.rules")), {}),
        "udev hook missing": (moved(node.hook("slurm-tpu-udev-event")), {}),
        "NodeName Gres stale": (
            edited(os.path.join(cluster.base, "etc", "nodes.conf"), "Gres=tpu:edgetpu_usb:1", "Gres=tpu:edgetpu_usb:2"),
            {},
        ),
        "munge not answering": (edited(cluster.slurm_conf, "AuthInfo=socket=", "AuthInfo=socket=/nonexistent"), {}),
        "no libedgetpu": (contextlib.nullcontext(), {"SLURM_TPU_LIBEDGETPU": "/nonexistent/libedgetpu.so.1"}),
        "libedgetpu ignores EDGETPU_VISIBLE_DEVICES": (
            contextlib.nullcontext(),
            {"SLURM_TPU_LIBEDGETPU": corals_own(node.work)},
        ),
        "hooks cannot import": (edited(node.hook("slurm-tpu-prolog"), root_line, "_ROOT = '/nonexistent'\n"), {}),
    }[case]


# case -> (the check that must fail, words its line must contain)
BROKEN = {
    "hook missing": ("hooks", ["Epilog", "slurm-tpu-epilog is missing"]),
    "hook world-writable": ("hooks", ["Prolog", "slurm-tpu-prolog is uid 0 mode 0777", "chmod 0755"]),
    "GresTypes lacking tpu": (
        "GresTypes",
        [f"GresTypes={GRES_TYPES.replace('tpu,', '')} lacks tpu", f"GresTypes={GRES_TYPES.replace('tpu,', '')},tpu"],
    ),
    "AccountingStorageTRES lacking the type": (
        "AccountingStorageTRES",
        ["AccountingStorageTRES lacks gres/tpu:edgetpu_usb", "AccountingStorageTRES=gres/tpu,gres/tpu:edgetpu_usb"],
    ),
    "accounting timer not enabled": (
        "accounting collector",
        ["slurm-tpu-accounting.timer is not enabled", "systemctl enable --now slurm-tpu-accounting.timer"],
    ),
    "accounting unit stale": (
        "accounting collector",
        ["slurm-tpu-accounting.service is stale", "slurm-tpu install --sysconfdir"],
    ),
    "gres.conf stale": ("gres.conf", ["differs from n1's hardware", "slurm-tpu gres-conf --output"]),
    "udev rules not loaded": ("udev loaded", ["idle usb-2-1.3", "mode 0666", "udevadm control --reload"]),
    "state dir wrong mode": ("state dir", ["mode 0777", "chmod 0755"]),
    "slurmd untested version": ("slurmd", ["Slurm 23.02.7", "not tested", "22.05.x and 25.11.x"]),
    "udev rules not installed": ("udev rules", ["60-slurm-tpu.rules is missing", "slurm-tpu install"]),
    "udev hook missing": (
        "udev rules",
        ["60-slurm-tpu.rules runs", "slurm-tpu-udev-event is missing", "slurm-tpu install --prefix"],
    ),
    "NodeName Gres stale": ("NodeName", ["Gres=tpu:edgetpu_usb:2", "the hardware gives Gres=tpu:edgetpu_usb:1"]),
    "munge not answering": ("munge", ["munge -n | unmunge fails", "munged"]),
    "no libedgetpu": ("libedgetpu", ["/nonexistent/libedgetpu.so.1", "libedgetpu1-std"]),
    "libedgetpu ignores EDGETPU_VISIBLE_DEVICES": (
        "EDGETPU_VISIBLE_DEVICES",
        ["ignores EDGETPU_VISIBLE_DEVICES", "opens the first, not the job's", "slurm-tpu install --libedgetpu"],
    ),
    "hooks cannot import": ("hooks import", ["slurm-tpu-prolog", "-I -S cannot import slurm_tpu", "/nonexistent"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_doctor_names_each_broken_setup_in_exactly_one_line(node, case):
    check, words = BROKEN[case]
    breaking, env = broken(node, case)
    with breaking:
        done = node.doctor(**env)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = failures(done)
    assert len(lines) == 1, f"{case}: {lines}"
    assert lines[0].startswith(f"FAIL  {check}: "), lines[0]
    for word in words:
        assert word in lines[0], f"{case}: {word!r} not in {lines[0]!r}"
    assert "; fix: " in lines[0]
    assert failures(node.doctor()) == []  # put back: the node is healthy again


# ---- install / uninstall leave a prefix as it was -------------------------------------------


def tree(root: str) -> dict[str, tuple]:
    """path -> (type, uid, gid, mode, sha256 of a file's bytes) for everything under ``root``."""
    from helpers import walk_files

    return {
        os.path.relpath(path, root): (
            stat.S_IFMT(info.st_mode),
            info.st_uid,
            info.st_gid,
            stat.S_IMODE(info.st_mode),
            digest,
        )
        for path, (info, digest) in walk_files(root).items()
    }


def test_install_then_uninstall_leaves_the_prefix_exactly_as_it_was(node):
    prefix = os.path.join(node.work, "other-prefix")
    etc = os.path.join(prefix, "etc")
    # What a node already has: another tool in libexec, other udev rules, and an
    # older hand-made slurm-tpu rules file that install replaces and uninstall restores.
    os.makedirs(os.path.join(prefix, "libexec", "other-tool"))
    os.makedirs(os.path.join(etc, "udev", "rules.d"))
    with open(os.path.join(prefix, "libexec", "other-tool", "run"), "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(os.path.join(prefix, "libexec", "other-tool", "run"), 0o750)
    with open(os.path.join(etc, "udev", "rules.d", "99-other.rules"), "w") as handle:
        handle.write("# someone else's\n")
    with open(os.path.join(etc, "udev", "rules.d", "60-slurm-tpu.rules"), "w") as handle:
        handle.write("# written by hand long ago\n")
    before = tree(prefix)
    args = ["--prefix", prefix, "--sysconfdir", etc]
    run([node.slurm_tpu, "install", *args, "--dry-run"], env=node.env(), cwd="/")
    assert tree(prefix) == before  # a dry run changes nothing
    run([node.slurm_tpu, "install", *args], env=node.env(), cwd="/")
    installed = tree(prefix)
    assert "libexec/slurm-tpu/slurm-tpu-prolog" in installed and "etc/slurm-tpu/config.yaml" in installed
    assert "libexec/slurm-tpu/slurm-tpu-hook-client" in installed  # built by install, removed by uninstall
    run([node.slurm_tpu, "install", *args], env=node.env(), cwd="/")
    assert tree(prefix) == installed  # idempotent
    run([node.slurm_tpu, "uninstall", *args, "--purge"], env=node.env(), cwd="/")
    assert tree(prefix) == before
    # Without --purge the config install wrote stays (and nothing else).
    run([node.slurm_tpu, "install", *args], env=node.env(), cwd="/")
    kept = run([node.slurm_tpu, "uninstall", *args], env=node.env(), cwd="/").stdout
    assert "kept " + os.path.join(etc, "slurm-tpu", "config.yaml") in kept
    after = tree(prefix)
    assert set(after) - set(before) == {"etc/slurm-tpu", "etc/slurm-tpu/config.yaml"}
    assert {path: after[path] for path in before} == before


# ---- last: it takes LiteRT away ------------------------------------------------------------------


def test_zz_doctor_on_a_tpu_node_without_litert(node):
    run([node.python, "-m", "pip", "uninstall", "-q", "-y", "ai-edge-litert"])
    done = node.doctor()
    lines = failures(done)
    assert done.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith("FAIL  TFLite runtime: no TFLite runtime could be imported"), lines[0]
    assert "pip install 'slurm-tpu[infer]'" in lines[0]
