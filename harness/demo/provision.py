"""What the demo's jobs need besides Slurm: a user, a runnable slurm-tpu, libedgetpu, models.

Everything lives under the base directory except the job user (a system account
with a home directory, so that ``su - USER`` gives a newcomer an ordinary shell).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig

from slurm_tpu.slurm import installation

from .errors import DemoError
from .layout import DOUBLE_SOURCE, JOBS_DIR, REPO, Layout

_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
_CHECK_IMPORTS = "import slurm_tpu.cli, slurm_tpu.runner, numpy, ai_edge_litert"


def check_user(name: str) -> None:
    """The job user's name is valid and, if the user exists, it is not root."""
    if not _USER_NAME.match(name):
        raise DemoError(f"--user {name!r}: not a valid user name (lower-case letters, digits, '_' or '-')")
    try:
        if pwd.getpwnam(name).pw_uid == 0:
            raise DemoError(f"--user {name} is root: the demo's jobs run as an unprivileged user")
    except KeyError:
        pass


def ensure_user(name: str) -> bool:
    """Create the unprivileged job user if missing; True when it was created now."""
    check_user(name)
    try:
        pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(
            [
                "useradd",
                "--system",
                "--create-home",
                "--home-dir",
                f"/home/{name}",
                "--shell",
                "/bin/sh",
                "--user-group",
                name,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise DemoError(f"cannot create the job user {name}: {done.stderr.strip()}") from None
        return True
    return False


def _runs_as(user: str, argv: list[str]) -> bool:
    done = subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, cwd="/", timeout=120)
    return done.returncode == 0


def _write_script(path: str, python: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(
            f"#!{python}\n# The demo's slurm-tpu, runnable by every job user.\n"
            "import sys\nfrom slurm_tpu.cli import run\nsys.exit(run())\n"
        )
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    # Beside it, the python3 users' own code runs with (LiteRT, numpy, Pillow), as a node
    # with tflite-runtime installed has: jobs/coral_example.sbatch runs Coral's code with it.
    tmp = os.path.join(os.path.dirname(path), "python3.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\nexec {python} "$@"\n')
    os.chmod(tmp, 0o755)
    os.replace(tmp, os.path.join(os.path.dirname(path), "python3"))


def job_side_slurm_tpu(layout: Layout, user: str) -> str:
    """``<base>/bin/slurm-tpu``, a slurm-tpu that the job user can run; returns its path.

    The checkout's venv is used as it is when the job user can run its Python. A
    venv built on a Python under a private directory (pyenv in /root) cannot be run
    by other users; then a venv of the system's python3 of the same version is made
    under the base directory that reads the checkout venv's packages.
    """
    os.makedirs(layout.bin, mode=0o755, exist_ok=True)
    script = os.path.join(layout.bin, "slurm-tpu")
    if _runs_as(user, [sys.executable, "-c", _CHECK_IMPORTS]):
        _write_script(script, sys.executable)
        return script
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system_python = shutil.which(f"python{version}", path="/usr/bin:/usr/local/bin")
    if not system_python:
        raise DemoError(
            f"job user {user} cannot run {sys.executable} (is it under a private directory such as "
            f"/root?) and there is no system python{version} to use instead: rebuild the venv with "
            "a system Python (rm -rf .venv; PYTHON=/usr/bin/python3 scripts/setup.sh)"
        )
    venv = layout.path("runtime")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([system_python, "-m", "venv", "--without-pip", venv], check=True, capture_output=True)
    site_dirs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    purelib = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(purelib, "slurm_tpu_checkout.pth"), "w", encoding="utf-8") as handle:
        handle.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in site_dirs) + "\n")
    python = os.path.join(venv, "bin", "python")
    if not _runs_as(user, [python, "-c", _CHECK_IMPORTS]):
        raise DemoError(
            f"job user {user} cannot import slurm-tpu from {site_dirs[0]} (is the checkout under a "
            "private directory?): clone slurm-tpu somewhere world-readable, e.g. /opt/slurm-tpu"
        )
    _write_script(script, python)
    return script


def build_libedgetpu_double(layout: Layout) -> str:
    """Compile the project's libedgetpu test double into ``<base>/lib`` (once)."""
    target = layout.libedgetpu
    if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(DOUBLE_SOURCE):
        return target
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    cc = shutil.which("gcc") or shutil.which("cc") or "gcc"
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", target + ".tmp", str(DOUBLE_SOURCE)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise DemoError(f"cannot compile {DOUBLE_SOURCE}: {done.stderr.strip().splitlines()[-1:]}")
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
    return target


def make_models(layout: Layout, images: int) -> None:
    """The generated classifier, labels and ``images`` test images (kept when already there)."""
    expected = os.path.join(layout.images, "expected.csv")
    if os.path.exists(layout.classifier) and os.path.exists(expected):
        with open(expected, encoding="utf-8") as handle:
            if sum(1 for _ in handle) == images:
                return
    from ..modelgen import write_models

    shutil.rmtree(layout.models, ignore_errors=True)
    write_models(layout.models, image_count=images)
    for root, _dirs, files in os.walk(layout.models):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def make_shared_dirs(layout: Layout) -> None:
    """Job output and results directories every job user can write (sticky, like /tmp)."""
    for directory in (layout.out, layout.results):
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o1777)


def double_root(layout: Layout) -> str:
    """EDGETPU_DOUBLE_ROOT: where the double finds a node's simulated /sys and /dev (``%n``: the
    job's $SLURMD_NODENAME), to open the device nodes the hooks hand over."""
    return layout.path("nodes", "%n")


def write_env_file(layout: Layout, double_devices: str) -> None:
    """``<base>/env.sh``: what a shell needs to use the demo cluster."""
    text = f"""# The slurm-tpu demo cluster. Use it from any shell:  . {layout.env_file}
export SLURM_CONF={layout.slurm_conf}
export PATH={":".join([layout.bin, *installation.find(use_daemons=False).dirs])}:$PATH
export SLURM_TPU_DEMO={layout.base}
export SLURM_TPU_JOBS={JOBS_DIR}
# This machine has no Edge TPU: libedgetpu is the project's test double. It lists
# only the devices listed here (the demo's simulated ones) and runs models on the CPU.
# Like the node's libedgetpu, it shows a job only its EDGETPU_VISIBLE_DEVICES, and it
# opens the device's node (the job's node's simulated /sys and /dev, under
# EDGETPU_DOUBLE_ROOT), so the kernel refuses a TPU that is not the job's. It is
# where libedgetpu.so.1 resolves for your own code (a real node: /usr/lib/<multiarch>).
export SLURM_TPU_LIBEDGETPU={layout.libedgetpu}
export EDGETPU_DOUBLE_DEVICES={double_devices}
export EDGETPU_DOUBLE_ROOT={double_root(layout)}
export LD_LIBRARY_PATH={os.path.dirname(layout.libedgetpu)}
"""
    with open(layout.env_file + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(layout.env_file + ".tmp", 0o644)
    os.replace(layout.env_file + ".tmp", layout.env_file)


def job_environment(layout: Layout, double_devices: str, user: str) -> dict[str, str]:
    """The environment the demo submits with: what env.sh gives a user's shell."""
    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:
        home = layout.out
    return {
        # The cluster's own Slurm clients first: a job calling srun/squeue must not get another release's.
        "PATH": ":".join([layout.bin, *installation.find(use_daemons=False).dirs, "/usr/local/bin:/usr/bin:/bin"]),
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "LANG": "C.UTF-8",
        "SLURM_CONF": layout.slurm_conf,
        "SLURM_TPU_DEMO": layout.base,
        "SLURM_TPU_JOBS": str(JOBS_DIR),
        "SLURM_TPU_LIBEDGETPU": layout.libedgetpu,
        "EDGETPU_DOUBLE_DEVICES": double_devices,
        "EDGETPU_DOUBLE_ROOT": double_root(layout),
        "LD_LIBRARY_PATH": os.path.dirname(layout.libedgetpu),
    }


def real_libedgetpu(layout: Layout) -> str | None:
    """The node's real libedgetpu (Coral's runtime with slurm-tpu's two patches, built by scripts/setup.sh
    from ../shared/libedgetpu) copied to ``<base>/lib/real``, for the shard jobs' unmodified Coral code;
    None when it was not built."""
    built = REPO / "build" / "libedgetpu" / "libedgetpu.so.1"
    if not built.exists():
        return None
    target = layout.path("lib", "real", "libedgetpu.so.1")
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    shutil.copyfile(built, target + ".tmp")
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
    return target
