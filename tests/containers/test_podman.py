"""Jobs in rootless Podman containers keep their Edge TPUs, and only theirs (issue 34, items 1, 4, 5, 7).

Real parts: real Podman 4.3 rootless (runc, host network, explicit ulimits: podman_support.py's
containers.conf), real unix users (helpers.USERS), the image harness/containers/image.py builds
offline, the CDI specs the real ``slurm-tpu cdi`` writes, the job's CDI names as the task prolog
gives them (SLURM_TPU_CDI_DEVICES, protocol/jobenv.py). The fake is the silicon: big_node's
device nodes are real character devices that reach no driver (podman_support.py), leased by
ownership as the Prolog leases them, and the node's libedgetpu is the test double
(tests/edgetpu_double), which opens the device node the real library would (a card's
/dev/apex_N, a stick's usbfs node from sysfs busnum/devnum) and lets the kernel's permission
check decide. The container gets it from the CDI spec, mounted over the image's libedgetpu.so.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from podman_support import Node, Podman, cdi_devices, device_flags, ensure_subids, make_node, rootless_problem, scratch

from helpers import USERS, require_root_and
from slurm_tpu.protocol.jobenv import libedgetpu_path

ALICE, BOB = USERS
CARD, OTHER_CARD = "pci-0000:06:00.0", "pci-0000:03:00.0"  # /dev/apex_2, /dev/apex_0 on big_node
STICK, OTHER_STICK = "usb-2-1", "usb-1-1.4"
DENIED = "Permission denied"


@pytest.fixture(scope="module")
def base():
    require_root_and(("runuser", "unshare", "usermod"), "rootless Podman as real users")
    problem = rootless_problem()
    if problem:
        pytest.skip(f"rootless Podman cannot run here: {problem}")
    path = Path(tempfile.mkdtemp(prefix="stp-", dir="/tmp"))  # short: see podman_support.Podman
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def node(base) -> Node:
    from edgetpu_double.build import build_double

    library = build_double(base)
    library.chmod(0o755)
    return make_node(base / "node", library)


@pytest.fixture(scope="module")
def image() -> str:
    from harness.containers import image as builder

    try:
        return builder.build().rootfs
    except RuntimeError as error:
        pytest.skip(f"no container image: {error}")


@pytest.fixture(scope="module")
def podman(users, base, node, image) -> dict[str, Podman]:
    """Each user's rootless Podman, the image imported."""
    engines = {}
    for n, user in enumerate(USERS):
        ensure_subids(user)
        engines[user] = Podman(user, base / f"p{n}", node.cdi)
        done = engines[user].run(["import", image, "localhost/slurm-tpu-coral:test"], timeout=600)
        assert done.returncode == 0, done.stderr
    yield engines
    for engine in engines.values():
        engine.stop()
        assert engine.pause_pid() is None  # no pause process left behind


@pytest.fixture(scope="module")
def work(base) -> Path:
    """The classifier model and an image with a known answer, readable by every user."""
    from harness.modelgen import classifier
    from harness.modelgen.images import write_images

    path = base / "work"
    path.mkdir(mode=0o755)
    (path / "classifier.tflite").write_bytes(classifier.build_classifier())
    (written,) = write_images(path, 1)
    (path / "labels.txt").write_text("\n".join(classifier.LABELS) + "\n")
    for item in path.iterdir():
        item.chmod(0o644)
    os.rename(written[0], path / "image.png")
    return path


@pytest.fixture
def leases(node):
    """Devices leased in the test; every node back to idle (root's 0600) after it."""
    yield node.lease
    node.release()


def job_env(node: Node, identities: list[str]) -> dict[str, str]:
    """What the task prolog exports for a job holding ``identities`` (protocol/jobenv.py)."""
    nodes = node.nodes()
    paths = [
        libedgetpu_path(i, "/dev/" + os.path.relpath(nodes[i], node.dev) if i.startswith("pci-") else None)[1]
        for i in identities
    ]
    return {
        "SLURM_TPU_DEVICES": ",".join(identities),
        "EDGETPU_VISIBLE_DEVICES": ",".join(paths),
        "SLURM_TPU_CDI_DEVICES": cdi_devices(identities),
    }


def container(
    engine: Podman,
    node: Node,
    env: dict[str, str],
    argv: list[str],
    extra: list[str] | None = None,
    work: Path | None = None,
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``podman run`` as the user guide writes it (one --device per SLURM_TPU_CDI_DEVICES entry),
    with the double's view of the node; returns the run and the double's log lines."""
    out = scratch(engine.user, node.base.parent)
    args = [
        "run", "--rm", *device_flags(env.get("SLURM_TPU_CDI_DEVICES", "")), *(extra or []),
        "-v", f"{node.sim}:/sim:ro", "-v", f"{out}:/out",
        *(["-v", f"{work}:/work:ro"] if work else []),
        "-e", f"EDGETPU_DOUBLE_DEVICES={node.double_devices()}", "-e", "EDGETPU_DOUBLE_ROOT=/sim",
        "-e", "EDGETPU_DOUBLE_LOG=/out/double.log",
        "localhost/slurm-tpu-coral:test", *argv,
    ]  # fmt: skip
    done = engine.run(args, env=env)
    log = out / "double.log"
    return done, (log.read_text().splitlines() if log.exists() else [])


# What a user's code does in the container with the library it finds (libedgetpu.so.1 by soname).
LIST = (
    "import ctypes, json\n"
    "class D(ctypes.Structure): _fields_ = [('type', ctypes.c_int), ('path', ctypes.c_char_p)]\n"
    "lib = ctypes.CDLL('libedgetpu.so.1'); lib.edgetpu_list_devices.restype = ctypes.POINTER(D)\n"
    "n = ctypes.c_size_t(); d = lib.edgetpu_list_devices(ctypes.byref(n))\n"
    "print(json.dumps([('pci' if d[i].type == 0 else 'usb') + ':' + d[i].path.decode() for i in range(n.value)]))\n"
)
OPEN = "import os, sys\nfor p in sys.argv[1:]:\n    try: os.close(os.open(p, os.O_RDWR)); print(p, 'opened')\n    except OSError as e: print(p, e.strerror)\n"  # noqa: E501
CREATE = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL('libedgetpu.so.1'); lib.edgetpu_create_delegate.restype = ctypes.c_void_p\n"
    "t = {'pci': 0, 'usb': 1}[sys.argv[1]]\n"
    "print('delegate' if lib.edgetpu_create_delegate(t, sys.argv[2].encode(), None, 0) else 'refused')\n"
)


def in_container(node: Node, identity: str) -> str:
    """The node a device's library opens inside the container (a card's by its host path; a
    stick's usbfs node is where CDI binds /dev/bus/usb)."""
    host = node.nodes()[identity]
    return "/dev/" + os.path.relpath(host, node.dev) if identity.startswith("usb-") else host


# ---- the job's TPU, in its container, with the node's library -------------------------------------


def test_coral_example_runs_unmodified_in_a_rootless_container_on_the_jobs_tpu(podman, node, work, leases):
    leases([CARD, STICK], ALICE)
    env = job_env(node, [CARD, STICK])
    argv = ["python3", "/opt/coral/classify.py", "/work/classifier.tflite", "/work/image.png", "/work/labels.txt"]
    done, log = container(podman[ALICE], node, env, argv, work=work)
    assert done.returncode == 0, done.stderr
    from harness.modelgen import classifier

    seen, answer = done.stdout.splitlines()[-2:]
    # The job's two Edge TPUs, in its order, and no other: the node's library read the job's variable.
    assert seen == "Edge TPUs this job sees: pci:/dev/apex_2, usb:/sys/bus/usb/devices/2-1"
    assert answer.startswith(f"{classifier.LABELS[0]}: ")
    # The default device (the first card) was opened, as the job's user, and nothing else tried.
    assert [line.split(" pid=")[0] for line in log] == [
        "create type=pci path=/dev/apex_2 options=-",
        "destroy type=pci path=/dev/apex_2 options=-",
    ]


def test_the_container_gets_the_nodes_library_over_the_images(podman, node, leases):
    leases([CARD], ALICE)
    done, _ = container(
        podman[ALICE], node, job_env(node, [CARD]), ["sh", "-c", "md5sum /usr/lib/x86_64-linux-gnu/libedgetpu.so.1"]
    )
    assert done.returncode == 0, done.stderr
    digest = subprocess.run(["md5sum", str(node.library)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert done.stdout.split()[0] == digest


def test_a_container_sees_only_its_jobs_devices(podman, node, leases):
    leases([STICK, CARD], ALICE)
    leases([OTHER_CARD], BOB)
    env = job_env(node, [STICK, CARD])
    done, _ = container(podman[ALICE], node, env, ["python3", "-c", LIST])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["usb:/sys/bus/usb/devices/2-1", "pci:/dev/apex_2"]
    # Of the node's cards only the job's has a node in the container: another job's is not there.
    cards = [node.nodes()[c] for c in (CARD, OTHER_CARD)]
    done, _ = container(podman[ALICE], node, env, ["python3", "-c", OPEN, *cards])
    assert done.stdout.splitlines() == [f"{cards[0]} opened", f"{cards[1]} No such file or directory"]


# ---- another user, another job: ownership decides (item 4) ---------------------------------------


def test_user_b_naming_a_s_devices_gets_nodes_that_do_not_open(podman, node, leases):
    """B names A's card and stick in --device (CDI names are public: the spec is the node's)."""
    leases([CARD, STICK], ALICE)
    leases([OTHER_CARD], BOB)
    env = {**job_env(node, [OTHER_CARD]), "SLURM_TPU_CDI_DEVICES": cdi_devices([OTHER_CARD, CARD, STICK])}
    nodes = [in_container(node, i) for i in (OTHER_CARD, CARD, STICK)]
    done, _ = container(podman[BOB], node, env, ["python3", "-c", OPEN, *nodes])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{nodes[0]} opened", f"{nodes[1]} {DENIED}", f"{nodes[2]} {DENIED}"]


# ---- hostile jobs (item 7) -------------------------------------------------------------------------


def test_a_job_that_edits_its_variables_gets_nothing_it_was_not_given(podman, node, leases):
    """B's job says it holds A's card (EDGETPU_VISIBLE_DEVICES, SLURM_TPU_CDI_DEVICES edited):
    the library goes for it and the kernel refuses, with the library's one line."""
    leases([CARD], ALICE)
    leases([OTHER_CARD], BOB)
    forged = {**job_env(node, [CARD]), "SLURM_TPU_DEVICES": OTHER_CARD}
    done, log = container(podman[BOB], node, forged, ["python3", "-c", CREATE, "pci", "/dev/apex_2"])
    assert done.stdout.strip() == "refused"
    failures = [line for line in done.stderr.splitlines() if "edgetpu_double.c]" in line]
    assert len(failures) == 1 and "Failed to open device [Apex (PCIe)] at [/dev/apex_2]" in failures[0]
    assert DENIED in failures[0]
    assert any("errno=EACCES" in line for line in log)


def test_a_job_that_names_a_host_node_or_mounts_dev_bus_usb_opens_nothing_of_others(podman, node, leases):
    """B adds A's card node by path (--device, not CDI) and the node's whole /dev/bus/usb (-v):
    rootless Podman binds them, ownership keeps them shut; B's own stick still opens."""
    leases([CARD, STICK], ALICE)
    leases([OTHER_STICK], BOB)
    env = job_env(node, [OTHER_STICK])
    extra = ["--device", node.nodes()[CARD], "-v", f"{node.dev / 'bus' / 'usb'}:/host-usb"]
    usb = {i: "/host-usb/" + os.path.relpath(node.nodes()[i], node.dev / "bus" / "usb") for i in (STICK, OTHER_STICK)}
    probes = [node.nodes()[CARD], usb[STICK], usb[OTHER_STICK]]
    done, _ = container(podman[BOB], node, env, ["python3", "-c", OPEN, *probes], extra=extra)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{probes[0]} {DENIED}", f"{probes[1]} {DENIED}", f"{probes[2]} opened"]


def test_an_idle_device_opens_for_nobody(podman, node, leases):
    """A device no job holds is root's 0600: named by anyone, in any container, it stays shut."""
    leases([STICK], BOB)
    env = {**job_env(node, [STICK]), "SLURM_TPU_CDI_DEVICES": cdi_devices([STICK, OTHER_CARD])}
    probes = [node.nodes()[OTHER_CARD], in_container(node, OTHER_STICK)]
    done, _ = container(podman[BOB], node, env, ["python3", "-c", OPEN, *probes])
    assert done.stdout.splitlines() == [f"{p} {DENIED}" for p in probes]


# ---- the pause process (item 5) ---------------------------------------------------------------------


def test_the_pause_process_never_holds_a_device_and_the_holder_scan_sees_the_container(podman, node, leases):
    """While a container holds the job's card the Epilog's holder scan finds its process; once it
    exits, nothing holds it, though the user's pause process (catatonit -P) lives on."""
    from slurm_tpu.access.processes import scan_holders

    leases([CARD], ALICE)
    card = node.nodes()[CARD]
    rdev, filesystem = os.stat(card).st_rdev, os.stat(card).st_dev
    hold = (
        "import os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
        "open('/out/holding', 'w').close()\ntime.sleep(600)\n"
    )
    out = scratch(ALICE, node.base.parent)
    name = f"holder-{out.name}"
    engine = podman[ALICE]
    args = ["run", "-d", "--name", name, *device_flags(cdi_devices([CARD])), "-v", f"{out}:/out"]
    started = engine.run([*args, "localhost/slurm-tpu-coral:test", "python3", "-c", hold, card])
    assert started.returncode == 0, started.stderr
    try:
        from helpers import wait_until

        wait_until(lambda: (out / "holding").exists(), what="the container to open the card")
        held = scan_holders([rdev], [filesystem], budget_s=30)
        assert held.complete
        (pid,) = of_user(held.holders, ALICE)
        assert pid not in pause_processes(ALICE)  # the container's python, not the pause process
    finally:
        engine.run(["rm", "--force", "--time", "0", name])
    pause = pause_processes(ALICE)
    assert pause, "rootless Podman keeps a pause process per user"
    after = scan_holders([rdev], [filesystem], budget_s=30)
    assert after.complete
    assert of_user(after.holders, ALICE) == []


def engine_uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def of_user(pids, user: str) -> list[int]:
    """Those of ``pids`` that are ``user``'s processes (still running)."""
    uid, found = engine_uid(user), []
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                found.append(pid)
        except OSError:
            continue
    return found


def pause_processes(user: str) -> list[int]:
    """The user's rootless Podman pause processes (catatonit -P)."""
    uid = engine_uid(user)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"catatonit") and b"-P" in argv:
            found.append(int(entry))
    return found


# ---- the node's real libedgetpu (the suite's patched build) in the image --------------------------


@pytest.fixture
def real_library_spec(node):
    """The node's CDI spec mounting the real libedgetpu (build/libedgetpu) for one test, then the double's again."""
    from helpers import real_libedgetpu

    library = real_libedgetpu()  # skips, saying why, where setup.sh did not build it

    def write(path) -> None:
        saved = node.base / "inventory.json"
        done = subprocess.run(
            [sys.executable, "-m", "slurm_tpu.cli", "cdi", "--output", str(node.cdi), "--inventory", str(saved),
             "--dev-root", str(node.dev), "--libedgetpu", str(path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    write(library)
    yield library
    write(node.library)


def test_the_nodes_real_libedgetpu_loads_in_the_container_and_reads_the_jobs_variable(
    podman, node, leases, real_library_spec
):
    """The patched library itself (built against Debian 12's abseil and flatbuffers, which the image
    carries), from the spec's mount: it loads in the container and is the host's build."""
    import ctypes

    function = ctypes.CDLL(real_library_spec).edgetpu_version
    function.restype = ctypes.c_char_p
    leases([STICK], ALICE)
    env = job_env(node, [STICK])
    code = (
        "import ctypes, json\n"
        "lib = ctypes.CDLL('libedgetpu.so.1'); lib.edgetpu_version.restype = ctypes.c_char_p\n"
        "print(lib.edgetpu_version().decode())\n"
    )
    done, _ = container(podman[ALICE], node, env, ["python3", "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == function().decode()
