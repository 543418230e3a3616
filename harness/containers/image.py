"""The tests' and the demo's container image, built offline and cached by its inputs.

``python -m harness.containers.image [--podman-import NAME] [--user USER]`` builds (or finds)
the image and prints one JSON object: its key, the rootfs tarball, the squashfs, the
Podman image name when imported.

What is in it: Debian bookworm ``minbase`` (``mmdebstrap``, from the Debian mirror apt
already uses), ``python3``, the libraries the node's libedgetpu links (:data:`PACKAGES`), and
in ``/usr/local/lib/python3.11/dist-packages`` (on Debian's
python3 path, so ``python3`` is all a job types in Podman and in enroot alike) the runtime the
suite itself runs: ai-edge-litert, numpy, Pillow, tflite + flatbuffers at the versions installed in this checkout's
.venv (pip downloads them once; the wheels are cached). The user code is Coral's example as
``jobs/coral_example.sbatch`` runs it (its Python, taken from that script, so one copy exists),
at ``/opt/coral/classify.py``. No libedgetpu: a job gets the node's (CDI / the enroot hook
bind-mount it at ``/usr/lib/x86_64-linux-gnu/libedgetpu.so.1``, where Coral's Debian package
puts it).

The cache (``/var/cache/slurm-tpu/containers/<key>/``) is keyed by a hash of every input:
the suite, the Debian packages, the pinned wheels, the user code and this builder's version.
A build writes into a temporary folder beside it and renames it into place, so a cache entry
is whole or absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from .. import ROOT

CACHE = Path(os.environ.get("SLURM_TPU_IMAGE_CACHE", "/var/cache/slurm-tpu/containers"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# The node's libedgetpu (the suite's patched build, scripts/build-libedgetpu.sh) links Debian 12's
# abseil, flatbuffers, libusb and libudev dynamically: an image that gets it must have them.
PACKAGES = (
    "python3",
    "ca-certificates",
    "libusb-1.0-0",
    "libabsl20220623",
    "libflatbuffers2",
    "libudev1",
    "libstdc++6",
)
# The runtime the suite uses (pyproject's "infer" extra: tflite + flatbuffers are the model schema
# slurm_tpu.runner reads), pinned to this checkout's versions.
WHEELS = ("ai-edge-litert", "numpy", "pillow", "tflite", "flatbuffers")
SITE = "usr/local/lib/python3.11/dist-packages"
CODE = Path(ROOT) / "jobs" / "coral_example.sbatch"
CODE_IN_IMAGE = "opt/coral/classify.py"
# Where Coral's Debian package (libedgetpu1-std) puts the library, and so where a job's
# container gets the node's: the image's loader finds it there with nothing else set.
LIBEDGETPU_IN_IMAGE = "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1"
BUILDER_VERSION = 2


@dataclass(frozen=True)
class Image:
    """A built image: its cache key and its two forms."""

    key: str
    rootfs: str  # a tarball of the root filesystem: podman import
    squashfs: str  # enroot's image format: enroot create / srun --container-image
    podman: str | None = None  # the Podman image name, when imported


def user_code() -> str:
    """Coral's example Python, as jobs/coral_example.sbatch runs it (its ``<<'EOF'`` heredoc)."""
    text = CODE.read_text()
    found = re.search(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S)
    if not found:
        raise RuntimeError(f"{CODE}: no <<'EOF' ... EOF Python block")
    return found.group(1) + "\n"


def pinned_wheels() -> list[str]:
    """``name==version`` for each runtime package, at the version this Python has installed."""
    pins = []
    for name in WHEELS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError as error:
            raise RuntimeError(f"{name} is not installed in this Python (scripts/setup.sh installs it)") from error
    return pins


def inputs() -> dict:
    """Everything the image is made of: its cache key is their hash."""
    return {
        "builder": BUILDER_VERSION,
        "suite": SUITE,
        "mirror": MIRROR,
        "packages": list(PACKAGES),
        "wheels": pinned_wheels(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "code": hashlib.sha256(user_code().encode()).hexdigest(),
    }


def key_of(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def _run(argv: list[str], **kwargs) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")


def _wheels(pins: list[str]) -> Path:
    """The pinned wheels (and their dependencies), downloaded once into the cache."""
    folder = CACHE / "wheels" / key_of({"wheels": pins, "python": sys.version_info[:2]})
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder), *pins])
        (folder / ".complete").write_text("\n".join(pins) + "\n")
    return folder


def _build(values: dict, into: Path) -> None:
    """Build the root filesystem under ``into``/rootfs, then its tarball and its squashfs."""
    root = into / "rootfs"
    _run(
        [
            "mmdebstrap",
            "--quiet",
            "--mode=root",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            # Docs, man pages and locales are no use to a job: a smaller image starts faster.
            "--dpkgopt=path-exclude=/usr/share/{doc,man,info,locale}/*",
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
            SUITE,
            str(root),
            MIRROR,
        ],
        timeout=1800,
    )
    wheels = _wheels(values["wheels"])
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-compile",
            "--find-links",
            str(wheels),
            "--target",
            str(root / SITE),
            *values["wheels"],
        ],
        timeout=1800,
    )
    code = root / CODE_IN_IMAGE
    code.parent.mkdir(parents=True, exist_ok=True)
    code.write_text(user_code())
    code.chmod(0o755)
    (root / "etc" / "slurm-tpu-image.json").write_text(json.dumps(values, sort_keys=True, indent=1) + "\n")
    # Without mmdebstrap's /dev nodes: the runtimes make the container's /dev, and enroot unpacks
    # the squashfs unprivileged (unsquashfs cannot make device nodes).
    _run(
        [
            "tar",
            "--numeric-owner",
            "--xattrs",
            "--exclude=./dev/*",
            "-C",
            str(root),
            "-cf",
            str(into / "rootfs.tar"),
            ".",
        ]
    )
    # enroot's own format (enroot import writes the same: squashfs, no compression tuning needed).
    squashfs = ["mksquashfs", str(root), str(into / "image.sqsh"), "-noappend", "-quiet", "-no-progress"]
    _run([*squashfs, "-all-root", "-wildcards", "-e", "dev/*"])
    shutil.rmtree(root)


def build(cache: Path | None = None) -> Image:
    """The image for this checkout's inputs: from the cache, or built now (a few minutes)."""
    global CACHE
    if cache is not None:
        CACHE = cache
    values = inputs()
    key = key_of(values)
    entry = CACHE / key
    if not (entry / "image.sqsh").exists():
        missing = [p for p in ("mmdebstrap", "mksquashfs", "tar") if shutil.which(p) is None]
        if missing:
            raise RuntimeError(f"cannot build the image: {', '.join(missing)} not installed (scripts/setup.sh)")
        if os.geteuid() != 0:
            raise RuntimeError("cannot build the image: mmdebstrap --mode=root needs root")
        CACHE.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=CACHE))
        try:
            _build(values, work)
            (work / "inputs.json").write_text(json.dumps(values, sort_keys=True, indent=1) + "\n")
            work.chmod(0o755)
            try:
                work.rename(entry)
            except OSError:
                if not (entry / "image.sqsh").exists():  # not another build's finished entry
                    raise
        finally:
            if work.exists():
                shutil.rmtree(work)
    return Image(key, str(entry / "rootfs.tar"), str(entry / "image.sqsh"))


def podman_import(image: Image, user: str | None = None) -> Image:
    """Import the image into ``user``'s rootless Podman store (root's without), once per key.

    The name is ``localhost/slurm-tpu-coral:<key>``; an existing one is kept.
    """
    name = f"localhost/slurm-tpu-coral:{image.key}"
    prefix = ["runuser", "-u", user, "--"] if user else []
    env = dict(os.environ)
    if user:
        import pwd

        account = pwd.getpwnam(user)
        env.update(HOME=account.pw_dir, USER=user, LOGNAME=user)
        env.pop("XDG_RUNTIME_DIR", None)
    exists = subprocess.run([*prefix, "podman", "image", "exists", name], env=env, cwd="/", capture_output=True)
    if exists.returncode != 0:
        _run(
            [*prefix, "podman", "import", "--change", "CMD=/bin/sh", "--change", "WORKDIR=/", image.rootfs, name],
            env=env,
            cwd="/",
            timeout=600,
        )
    return Image(image.key, image.rootfs, image.squashfs, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.containers.image", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help=f"the cache folder (default {CACHE})")
    parser.add_argument("--podman-import", action="store_true", help="also import it into Podman")
    parser.add_argument("--user", help="whose rootless Podman store to import into (default: this user's)")
    args = parser.parse_args(argv)
    try:
        image = build(args.cache)
        if args.podman_import:
            image = podman_import(image, args.user)
    except RuntimeError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(image)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
