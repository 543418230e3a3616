"""The native pieces build from their pinned public sources (scripts/sources.lock, scripts/sources.sh).

No network: a local mirror is built from the offline archives in ../shared, laid out as GitHub
serves them (``<owner>/<repo>/archive/<commit>.tar.gz`` holding ``<repo>-<commit>/``, raw files at
``<owner>/<repo>/<commit>/<path>``), served by a 127.0.0.1 http.server, and
SLURM_TPU_SOURCES_MIRROR points at it. Skips without ../shared.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import REPO

SHARED = REPO.parent / "shared"
LOCK = REPO / "scripts" / "sources.lock"
BUNDLE = SHARED / "libedgetpu" / "libedgetpu-src-bundle.tar.xz"
OFFLINE = {  # prefix in sources.lock -> its offline archive (one top folder)
    "libedgetpu-src": BUNDLE,
    "slurm-25.11": SHARED / "slurm" / "slurm-25.11.7.tar.xz",
    "enroot": SHARED / "containers" / "enroot-4.1.2-src.tar.xz",
    "pyxis": SHARED / "containers" / "pyxis-0.24.0-src.tar.xz",
}

pytestmark = pytest.mark.skipif(not BUNDLE.exists(), reason="no offline archives in ../shared")


def pins() -> list[tuple[str, str, str, str]]:
    """sources.lock's lines: (name, url, kind, digest)."""
    lines = (line.split() for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return [(name, url, kind, digest) for name, url, kind, digest in lines]


def content_digest(top: Path) -> str:
    """The lock's content digest, written again here from its header (the shell's must agree)."""
    files: list[tuple[bytes, str]] = []
    links: list[bytes] = []
    for path in top.rglob("*"):
        rel = path.relative_to(top).as_posix()
        if path.is_symlink():
            links.append(f"symlink {rel} -> {os.readlink(path)}\n".encode())
        elif path.is_file():
            files.append((rel.encode(), hashlib.sha256(path.read_bytes()).hexdigest()))
    text = b"".join(f"{digest}  ".encode() + rel + b"\n" for rel, digest in sorted(files))
    text += b"".join(sorted(links, key=lambda line: line.split(b" -> ")[0]))
    return hashlib.sha256(text).hexdigest()


def bash(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT with scripts/sources.sh sourced, in the checkout."""
    return subprocess.run(
        ["bash", "-c", f". scripts/sources.sh && {script}", "bash", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict[str, Path]:
    """Each offline archive unpacked: prefix -> its top folder."""
    base = tmp_path_factory.mktemp("offline")
    tops = {}
    for prefix, archive in OFFLINE.items():
        if not archive.exists():
            continue
        with tarfile.open(archive) as tar:
            tar.extractall(base / prefix)
        (tops[prefix],) = (base / prefix).iterdir()
    return tops


def mirror_path(url: str) -> str:
    """Where the mirror keeps URL: its path after the host (the rule of SLURM_TPU_SOURCES_MIRROR)."""
    return url.split("://", 1)[1].split("/", 1)[1]


def local_copy(name: str, offline: dict[str, Path]) -> Path:
    prefix = next(p for p in OFFLINE if name == p or name.startswith(p + "/"))
    return offline[prefix] / name[len(prefix) :].lstrip("/")


def build_mirror(root: Path, offline: dict[str, Path], prefixes: tuple[str, ...], tamper: str = "") -> Path:
    """A mirror of PREFIXES' sources under ROOT; TAMPER names one source with one byte changed."""
    entries = pins()
    for name, url, kind, _ in entries:
        if not any(name == p or name.startswith(p + "/") for p in prefixes):
            continue
        target = root / mirror_path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = local_copy(name, offline)
        if kind == "file":
            data = bytearray(source.read_bytes())
            if name == tamper:
                data[len(data) // 2] ^= 1
            target.write_bytes(bytes(data))
            continue
        # GitHub's top folder: <repo>-<commit> (cgit's: the snapshot's name).
        top = target.name[: -len(".tar.gz")]
        if "/archive/" in url:
            top = f"{url.split('/archive/')[0].rsplit('/', 1)[1]}-{top}"
        nested = [other[len(name) + 1 :] for other, *_ in entries if other.startswith(name + "/")]
        with tarfile.open(target, "w:gz", compresslevel=1) as tar:
            tar.add(source, arcname=top, filter=lambda info: None if _below(info.name, top, nested) else info)
            if name == tamper:
                victim = next(p for p in sorted(source.rglob("*")) if p.is_file() and not p.is_symlink())
                data = bytearray(victim.read_bytes())
                data[0] ^= 1
                info = tar.gettarinfo(victim, arcname=f"{top}/{victim.relative_to(source).as_posix()}")
                tar.addfile(info, io.BytesIO(bytes(data)))  # the later member wins on extraction
    return root


def _below(member: str, top: str, nested: list[str]) -> bool:
    rel = member[len(top) + 1 :]
    return any(rel == sub or rel.startswith(sub + "/") for sub in nested)


@pytest.fixture(scope="module")
def serve():
    """serve(root) -> a 127.0.0.1 http URL serving ROOT (stopped after the module)."""
    servers = []

    def start(root: Path) -> str:
        handler = partial(_QuietHandler, directory=str(root))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, offline, serve) -> str:
    """The libedgetpu sources and enroot (with its three submodules), served over http."""
    root = build_mirror(tmp_path_factory.mktemp("mirror"), offline, ("libedgetpu-src", "enroot"))
    return serve(root)


def test_the_shell_and_this_file_agree_on_the_digest(offline):
    top = offline["pyxis"]
    result = bash('sources_digest "$1"', {}, str(top))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == content_digest(top)
    # Symbolic links count too (enroot's linux-headers has some).
    headers = offline["enroot"] / "deps" / "linux-headers"
    assert any(p.is_symlink() for p in headers.iterdir())
    assert bash('sources_digest "$1"', {}, str(headers)).stdout.strip() == content_digest(headers)


@pytest.mark.parametrize("prefix", list(OFFLINE))
def test_every_pin_matches_the_offline_archive(prefix, offline, tmp_path):
    if prefix not in offline:
        pytest.skip(f"no {OFFLINE[prefix]}")
    env = {"SLURM_TPU_SOURCES_CACHE": str(tmp_path / "cache"), "SLURM_TPU_SOURCES_MIRROR": "http://127.0.0.1:9"}
    result = bash('sources_assemble "$1" "$2" "$3"', env, prefix, str(tmp_path / "tree"), str(offline[prefix]))
    assert result.returncode == 0, result.stderr
    assert content_digest(tmp_path / "tree") == content_digest(_pinned_part(offline[prefix], prefix))


def _pinned_part(top: Path, prefix: str) -> Path:
    """The bundle holds more than the pinned sources (its build.sh, patches): the pinned part."""
    if prefix != "libedgetpu-src":
        return top
    part = top.parent / "pinned"
    if not part.exists():
        part.mkdir()
        for name in ("libedgetpu", "tensorflow"):
            shutil.copytree(top / name, part / name, symlinks=True)
    return part


@pytest.mark.parametrize("prefix", ["libedgetpu-src", "enroot"])
def test_the_mirror_gives_the_offline_tree(prefix, mirror, offline, tmp_path):
    env = {"SLURM_TPU_SOURCES_CACHE": str(tmp_path / "cache"), "SLURM_TPU_SOURCES_MIRROR": mirror}
    result = bash('sources_assemble "$1" "$2"', env, prefix, str(tmp_path / "tree"))
    assert result.returncode == 0, result.stderr
    assert content_digest(tmp_path / "tree") == content_digest(_pinned_part(offline[prefix], prefix))
    # Cached by digest: a second assembly needs no mirror at all.
    env["SLURM_TPU_SOURCES_MIRROR"] = "http://127.0.0.1:9"
    again = bash('sources_assemble "$1" "$2"', env, prefix, str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert content_digest(tmp_path / "again") == content_digest(tmp_path / "tree")


@pytest.mark.parametrize("tampered", ["libedgetpu-src/tensorflow/tensorflow/lite/util.h", "libedgetpu-src/libedgetpu"])
def test_a_tampered_source_is_refused_and_not_cached(tampered, offline, serve, tmp_path):
    url = serve(build_mirror(tmp_path / "mirror", offline, ("libedgetpu-src",), tamper=tampered))
    cache = tmp_path / "cache"
    env = {"SLURM_TPU_SOURCES_CACHE": str(cache), "SLURM_TPU_SOURCES_MIRROR": url}
    result = bash('sources_assemble "$1" "$2"', env, "libedgetpu-src", str(tmp_path / "tree"))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    pinned = next(digest for name, _, _, digest in pins() if name == tampered)
    assert line.startswith(f"sources: {tampered} from {url}/")
    assert f"pins {pinned}" in line
    assert "refusing it" in line
    # Nothing of it in the cache, nothing half-written.
    assert not (cache / pinned).exists()
    assert not list(cache.glob(".part.*"))


def _serve_tree(serve, root: Path, name: str, source: Path, members) -> str:
    """Serve the pinned tree NAME as GitHub would, from SOURCE, with MEMBERS(tar, top) added last (a
    later member wins on extraction) and the members under a name MEMBERS returns left out."""
    (url,) = [url for pin, url, _, _ in pins() if pin == name]
    target = root / mirror_path(url)
    target.parent.mkdir(parents=True, exist_ok=True)
    top = f"{url.split('/archive/')[0].rsplit('/', 1)[1]}-{target.name[: -len('.tar.gz')]}"
    with tarfile.open(target, "w:gz", compresslevel=1) as tar:
        left_out = members(None, top)
        tar.add(source, arcname=top, filter=lambda info: None if _below(info.name, top, left_out) else info)
        members(tar, top)
    return serve(root)


def _assemble(prefix: str, url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"SLURM_TPU_SOURCES_CACHE": str(tmp_path / "cache"), "SLURM_TPU_SOURCES_MIRROR": url}
    return bash('sources_assemble "$1" "$2"', env, prefix, str(tmp_path / "tree"))


def test_a_special_file_in_a_pinned_tree_is_refused(offline, serve, tmp_path):
    """A FIFO (or a device node: tar makes them as root) changes no content digest; it is refused."""

    def members(tar, top):
        if tar is not None:
            info = tarfile.TarInfo(f"{top}/api/not-a-source")
            info.type = tarfile.FIFOTYPE
            tar.addfile(info)
        return []

    url = _serve_tree(
        serve, tmp_path / "mirror", "libedgetpu-src/libedgetpu", offline["libedgetpu-src"] / "libedgetpu", members
    )
    result = _assemble("libedgetpu-src/libedgetpu", url, tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "sources: libedgetpu-src/libedgetpu: refusing it: it holds a special file (api/not-a-source)"
    ]
    assert not list((tmp_path / "cache").iterdir())


def test_the_archives_modes_are_not_kept(offline, serve, tmp_path):
    """Same content, hostile modes (setuid, writable by all): the cached tree is root's, read-only to others."""
    victim = offline["libedgetpu-src"] / "libedgetpu" / "Makefile"

    def members(tar, top):
        if tar is not None:
            info = tar.gettarinfo(victim, arcname=f"{top}/Makefile")
            info.mode = 0o6777
            tar.addfile(info, io.BytesIO(victim.read_bytes()))
        return []

    url = _serve_tree(
        serve, tmp_path / "mirror", "libedgetpu-src/libedgetpu", offline["libedgetpu-src"] / "libedgetpu", members
    )
    result = _assemble("libedgetpu-src/libedgetpu", url, tmp_path)
    assert result.returncode == 0, result.stderr
    (entry,) = list((tmp_path / "cache").iterdir())
    modes = {path: path.lstat().st_mode for path in [entry, *entry.rglob("*")] if not path.is_symlink()}
    assert modes[entry / "Makefile"] & 0o7777 == 0o755
    assert not [path for path, mode in modes.items() if mode & 0o7022]


def test_a_nested_source_behind_a_symlink_is_refused_and_nothing_outside_is_removed(offline, serve, tmp_path):
    """enroot's deps/ as a symlink out of the tree: removing deps/musl (a source of its own) before
    the digest would follow it; the tree is refused first and the folder it points at is untouched."""
    outside = tmp_path / "outside"
    (outside / "musl").mkdir(parents=True)
    (outside / "musl" / "keep").write_text("kept\n")

    def members(tar, top):
        if tar is None:
            return ["deps"]
        info = tarfile.TarInfo(f"{top}/deps")
        info.type = tarfile.SYMTYPE
        info.linkname = str(outside)
        tar.addfile(info)
        return []

    url = _serve_tree(serve, tmp_path / "mirror", "enroot", offline["enroot"], members)
    result = _assemble("enroot", url, tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["sources: enroot: refusing it: deps is a symlink"]
    assert (outside / "musl" / "keep").read_text() == "kept\n"


def test_no_bundle_and_no_network_skips_the_build(tmp_path):
    env = {
        **os.environ,
        "SLURM_TPU_LIBEDGETPU_SRC": str(tmp_path / "no-bundle"),
        "SLURM_TPU_LIBEDGETPU_CACHE": str(tmp_path / "cache"),
        "SLURM_TPU_SOURCES_CACHE": str(tmp_path / "sources"),
        "SLURM_TPU_SOURCES_MIRROR": "http://127.0.0.1:9",  # nothing listens there
        "SKIP_APT": "1",
    }
    output = tmp_path / "out" / "libedgetpu.so.1"
    result = subprocess.run(
        [str(REPO / "scripts" / "build-libedgetpu.sh"), "--output", str(output)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "could not be downloaded: skipping the real libedgetpu" in result.stdout
    assert not output.exists()
    assert not list((tmp_path / "cache").glob("*/libedgetpu.so.1"))


def _build_tools_or_skip() -> None:
    missing = [tool for tool in ("flatc", "xxd", "g++", "patch", "make", "file") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"build tools missing: {', '.join(missing)} (scripts/setup.sh installs them)")


def build_libedgetpu(tmp_path: Path, name: str, env: dict[str, str], *args: str) -> Path:
    output = tmp_path / name / "libedgetpu.so.1"
    result = subprocess.run(
        [str(REPO / "scripts" / "build-libedgetpu.sh"), "--output", str(output), *args],
        env={**os.environ, "SKIP_APT": "1", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert output.is_symlink(), result.stdout
    return output.resolve()


def test_the_public_path_builds_the_bundles_library_byte_for_byte(mirror, tmp_path):
    """Slow (about a minute per build on 2 cores): both paths build, each in its own cache."""
    _build_tools_or_skip()
    from_bundle = build_libedgetpu(
        tmp_path,
        "bundle",
        {
            "SLURM_TPU_LIBEDGETPU_CACHE": str(tmp_path / "cache-bundle"),
            "SLURM_TPU_LIBEDGETPU_SRC": str(BUNDLE.parent),
            "SLURM_TPU_SOURCES_CACHE": str(tmp_path / "sources-bundle"),
        },
    )
    from_mirror = build_libedgetpu(
        tmp_path,
        "public",
        {
            "SLURM_TPU_LIBEDGETPU_CACHE": str(tmp_path / "cache-public"),
            "SLURM_TPU_LIBEDGETPU_SRC": str(tmp_path / "no-bundle"),
            "SLURM_TPU_SOURCES_CACHE": str(tmp_path / "sources"),
            "SLURM_TPU_SOURCES_MIRROR": mirror,
        },
    )
    # Byte-identical, not only symbol-identical: the same pinned bytes and patches, a fixed
    # SOURCE_DATE_EPOCH, and -ffile-prefix-map keeps each build's own folder out of __FILE__.
    assert from_bundle.read_bytes() == from_mirror.read_bytes()
    # The sources came from the mirror: its trees are in the sources cache.
    assert any((tmp_path / "sources").iterdir())
