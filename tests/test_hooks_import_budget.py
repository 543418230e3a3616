"""The root hooks' fast path imports none of json, re, typing, dataclasses, yaml, subprocess, enum.

The hooks run as root on every job (and udev event); each of those modules costs
milliseconds of start-up, and their absence is what ``python3 -I -S`` buys.
Measured for real: a local Slurm cluster runs jobs whose Prolog/Epilog are the
project's own hooks, each Python hook started with exactly its shebang's flags
plus ``-X importtime``, which makes the interpreter list every module it
imports on stderr. The list comes from the hook process itself, not from a
re-import in the test. The second job is the one checked: the first builds the
hooks' snapshot (the slow path, which may load YAML and more). The udev hook is
its shipped entry script (udev/slurm-tpu-udev-event, what the udev rules run),
run by the cluster's emulated udev on each revocation and once more by the test
for an event that changes nothing (a stick's ``change``, the usual event).

Every slurm_tpu module a hook loads must be declared on the fast path
(slurm_tpu/hooks/__init__.py FAST_PATH), whose import rule tests/test_fast_path.py
checks from the source, without a cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import wait_until
from slurm_tpu.hooks import FAST_PATH

REPO = Path(__file__).resolve().parent.parent
HARDWARE = REPO / "tests" / "isolation" / "hardware" / "n1_two_tpus.umockdev"
FORBIDDEN = ("json", "re", "typing", "dataclasses", "yaml", "subprocess", "enum")
UDEV_HOOK = REPO / "udev" / "slurm-tpu-udev-event"  # what the udev rules run (RUN+=, installed copy)
# A revoked USB stick's remove and add events move its node, so they rewrite the hooks'
# inventory.json (protocol/inventory.py imports json for that, and json brings re and
# enum); the usual event, an unchanged node, must not. Neither ever loads the CLI or YAML.
NEVER_IN_THE_UDEV_HOOK = ("click", "yaml", "typing", "dataclasses", "subprocess", "slurm_tpu.cli", "slurm_tpu.config")
USB_DEVPATH = "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.3"  # the stick of n1_two_tpus


def imported_modules(stderr: str) -> list[str]:
    """Every module a ``python -X importtime`` process imported, in order, from its stderr."""
    modules = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":  # the header line
                modules.append(name)
    return modules


def undeclared(modules: list[str]) -> list[str]:
    """The slurm_tpu modules among ``modules`` that slurm_tpu/hooks/__init__.py does not list in FAST_PATH."""
    return sorted(name for name in modules if name.split(".")[0] == "slurm_tpu" and name not in FAST_PATH)


def over_budget(modules: list[str]) -> list[str]:
    """The forbidden top-level modules among ``modules`` (``re._parser`` counts as ``re``)."""
    return sorted({name.split(".")[0] for name in modules} & set(FORBIDDEN))


def interpreter(script: Path) -> list[str]:
    """The script's shebang as an argument list, with ``-X importtime`` added."""
    first = script.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("#!") and "python3" in first, f"{script} is not a Python hook: {first}"
    program, *flags = first[2:].split()
    assert "-IS" in flags or {"-I", "-S"} <= set(flags), f"{script} does not run isolated: {first}"
    return [program, *flags, "-X", "importtime"]


# ---- the checker, on processes whose imports are known ----------------------------------


def test_the_checker_sees_what_a_real_process_imports():
    def run(code: str) -> list[str]:
        done = subprocess.run(
            ["/usr/bin/python3", "-I", "-S", "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return imported_modules(done.stderr)

    heavy = run("import json, os")
    assert "json.decoder" in heavy and "posixpath" in heavy
    assert over_budget(heavy) == ["enum", "json", "re"]  # json needs re, re needs enum
    assert over_budget(run("import os, stat")) == []
    assert over_budget(["re._parser", "typing_extensions", "yamlish", "slurm_tpu.jobenv"]) == ["re"]
    assert undeclared(["os", "slurm_tpu.hooks.prolog", "slurm_tpu.config", "slurm_tpu_x"]) == ["slurm_tpu.config"]


# ---- the hooks, run by slurmd for real jobs -------------------------------------------------

SHIM = """#!/bin/sh
# Runs {script} as Slurm would, but with -X importtime; its stderr goes to one file per run.
log={logs}/{kind}.$$
{argv} "$@" 2>"$log.part"
rc=$?
mv "$log.part" "$log.done"
exit $rc
"""


def _shim(directory: Path, name: str, kind: str, script: Path, logs: Path) -> Path:
    path = directory / name
    argv = " ".join([*interpreter(script), str(script)])
    path.write_text(SHIM.format(script=script, logs=logs, kind=kind, argv=argv))
    path.chmod(0o755)
    return path


def _runs(logs: Path, kind: str) -> list[str]:
    """The stderr of every finished run of ``kind``, oldest first."""
    files = sorted(logs.glob(f"{kind}.*.done"), key=lambda p: p.stat().st_mtime_ns)
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


@pytest.fixture(scope="module")
def measured(cluster_factory, tmp_path_factory):
    """Two jobs on the real hooks: the stderr of each prolog and epilog run, and of one udev event."""
    from harness.localcluster.cluster import Hooks, NodeSpec

    work = tmp_path_factory.mktemp("budget")
    os.chmod(work, 0o755)
    logs, hooks = work / "logs", work / "prolog"
    logs.mkdir()
    hooks.mkdir()
    prolog = _shim(hooks, "prolog", "prolog", REPO / "prolog" / "slurm-tpu-prolog", logs)
    epilog = _shim(hooks, "epilog", "epilog", REPO / "epilog" / "slurm-tpu-epilog", logs)
    udev = _shim(hooks, "udev", "revocation", UDEV_HOOK, logs)
    cluster = cluster_factory(
        [NodeSpec("n1", str(HARDWARE))],
        hooks=Hooks(
            prolog=str(prolog),
            epilog=str(epilog),
            task_prolog=str(REPO / "prolog" / "slurm-tpu-task-prolog"),
            udev=str(udev),
        ),
    )
    # A node with an accounting collector (its first run makes this spool): the epilog also
    # spools each job's figures (slurm_tpu/protocol/job_record.py), under the same budget.
    spool = Path(cluster.accounting_spool("n1"))
    spool.mkdir(mode=0o700, parents=True)
    jobs = []
    for round_ in (1, 2):
        job = cluster.sbatch(
            ["--gres=tpu:2", "-w", "n1", "-o", "/dev/null"], '#!/bin/sh\ntest -n "$SLURM_TPU_DEVICES"\n'
        )
        assert cluster.wait_for_jobs([job], timeout=120) == {job: "COMPLETED"}
        jobs.append(str(job))
        wait_until(lambda: len(_runs(logs, "epilog")) >= round_, 60, f"job {job}'s epilog")
        # Its USB stick is power-cycled at job end; the release ends when it is back.
        leases = Path(cluster.node_dir("n1")) / "state" / "leases"
        wait_until(lambda: not any(leases.iterdir()), 60, "the revoked stick to come back")
    assert sorted(os.listdir(spool)) == sorted(jobs)  # the spooling path ran in the measured epilogs
    inventory = json.loads((Path(cluster.node_dir("n1")) / "state" / "inventory.json").read_text())
    usb_node = next(a["device_nodes"][0] for a in inventory["accelerators"] if a["identity"] == "usb-2-1.3")
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_TPU_CONFIG": cluster.node_config("n1"),
        "SLURMD_NODENAME": "n1",
        "SLURM_CONF": cluster.slurm_conf,
        "ACTION": "change",
        "DEVPATH": USB_DEVPATH,
        "DEVNAME": usb_node,
        "SUBSYSTEM": "usb",
        "DEVTYPE": "usb_device",
    }
    # Run as udev runs it: the program itself (its #! line), here with -X importtime added.
    udev = subprocess.run(
        [*interpreter(UDEV_HOOK), str(UDEV_HOOK)], env=env, capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert udev.returncode == 0, udev.stderr[-2000:]
    return {
        "prolog": _runs(logs, "prolog"),
        "epilog": _runs(logs, "epilog"),
        "udev-event": [udev.stderr],
        "revocation": _runs(logs, "revocation"),
    }


@pytest.mark.slurm
@pytest.mark.parametrize(
    "hook, did_its_work",
    [
        ("prolog", "slurm_tpu.hooks.leasing"),  # it leased the job's devices
        ("epilog", "slurm_tpu.hooks.leasing"),  # it released them
        ("udev-event", "slurm_tpu.hooks.udev_event"),
    ],
)
def test_a_hooks_fast_path_stays_within_its_imports(measured, hook, did_its_work):
    runs = measured[hook]
    assert runs, f"no {hook} run was recorded"
    modules = imported_modules(runs[-1])
    print(f"{hook}: {len(modules)} modules: {' '.join(modules)}")  # the measurement, with pytest -s
    assert did_its_work in modules, f"{hook} did not reach its work: {modules}"
    # The fast path: settings from the snapshot, so neither the YAML config nor its reader.
    assert "slurm_tpu.config" not in modules and "yaml" not in modules, f"{hook} took the slow path"
    assert over_budget(modules) == [], f"{hook} imports {over_budget(modules)}: {modules}"
    assert undeclared(modules) == [], f"{hook} loads modules not declared in FAST_PATH: {undeclared(modules)}"


@pytest.mark.slurm
def test_the_udev_hooks_revocation_events_load_neither_the_cli_nor_yaml(measured):
    runs = measured["revocation"]
    assert len(runs) >= 4, f"expected a remove and an add per job, got {len(runs)} udev runs"
    for stderr in runs[-2:]:  # the second job's stick: removed, then back with a new node
        modules = imported_modules(stderr)
        print(f"revocation event: {len(modules)} modules: {' '.join(modules)}")
        assert "slurm_tpu.hooks.udev_event" in modules and "json" in modules  # it rewrote inventory.json
        assert not set(modules) & set(NEVER_IN_THE_UDEV_HOOK), sorted(set(modules) & set(NEVER_IN_THE_UDEV_HOOK))
        assert undeclared(modules) == [], f"a revocation event loads modules not in FAST_PATH: {undeclared(modules)}"


def test_the_task_prolog_starts_no_python():
    text = (REPO / "prolog" / "slurm-tpu-task-prolog").read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh\n") and "python" not in text.lower()
