"""The per-job secret and the address file that hands it to the job's owner, and no one else.

Any user can reach any node's ports, so the server's only protection is a token (32
random bytes, ``Authorization: Bearer``, compared in constant time). It reaches the owner
in ``~/.slurm-tpu/serve/<jobid>.json``: both directories the user's own, mode 0700,
opened without following symlinks and checked with ``fstat`` after opening (no check/act
race); the file is created under a temporary name (``O_EXCL | O_NOFOLLOW``, 0600) and
renamed into place, so a reader never sees half a file and a planted link is replaced,
never written through. Readers refuse a file that others could read.

An address file can outlive its server (SIGKILL, the OOM killer), and its port be anyone's.
So the client sends the token only on a connection whose listener proved it holds it
(:func:`proof`: an HMAC of a nonce the client just chose tells a listener nothing about
the token and cannot be replayed); docs/user-guide.md ("After a crash") gives the exchange.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping

from ...errors import SlurmTpuError
from ...protocol import FormatError
from ...protocol.serve_address import DIR_PARTS, SUFFIX, Address, decode, encode, file_name
from ..errors import FileError, UsageError

TOKEN_BYTES = 32
SCHEME = "Bearer"
TOKEN_ENV = "SLURM_TPU_SERVE_TOKEN"  # a client's token when it has no address file (host:port)
PROOF_PATH = "/v1/slurm-tpu/proof"  # answered without the token (the challenge of the module docstring)
NONCE_BYTES = 32
_PROOF_LABEL = b"slurm-tpu serve proof v1\0"  # binds the HMAC to this use of the token, and no other
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class AddressFileError(FileError):
    """The address file cannot be written, found or trusted."""


def new_token() -> str:
    """A fresh secret (URL-safe text, 256 bits)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant time in the token)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower():
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "replace"), token.encode())


def new_nonce() -> str:
    """A fresh challenge for a listener (hex, 256 bits)."""
    return secrets.token_hex(NONCE_BYTES)


def valid_nonce(nonce: str) -> bool:
    """Whether ``nonce`` is a challenge the server answers: 32 to 64 bytes in lowercase hex."""
    return 2 * NONCE_BYTES <= len(nonce) <= 4 * NONCE_BYTES and all(c in "0123456789abcdef" for c in nonce)


def proof(token: str, nonce: str) -> str:
    """What only the holder of ``token`` can answer to the challenge ``nonce`` (hex HMAC-SHA256)."""
    return hmac.new(token.encode(), _PROOF_LABEL + nonce.encode(), hashlib.sha256).hexdigest()


def proof_matches(token: str, nonce: str, answer: object) -> bool:
    """Whether a listener's ``answer`` to ``nonce`` proves it holds ``token`` (constant time)."""
    if not isinstance(answer, str):
        return False
    return hmac.compare_digest(answer.encode("utf-8", "replace"), proof(token, nonce).encode())


def serve_dir(environ: Mapping[str, str] = os.environ) -> str:
    """``$HOME/.slurm-tpu/serve``."""
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, *DIR_PARTS)


def address_path(job_id: str, environ: Mapping[str, str] = os.environ) -> str:
    return os.path.join(serve_dir(environ), file_name(job_id))


def _check_job_id(job_id: str) -> None:
    # The id names a file: digits (and an array task's _N) only, never a path.
    if not job_id or not job_id.replace("_", "").isdigit():
        raise UsageError(f"job id '{job_id}' is not a Slurm job id (digits, or ARRAYID_TASK)")


def _own_private_dir(parent_fd: int, name: str, path: str, create: bool) -> int:
    """Open ``name`` under ``parent_fd`` as a directory of ours, mode 0700; its fd."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass  # checked below, as a directory found
        except OSError as exc:
            raise AddressFileError(
                f"cannot create {path} ({exc.strerror}): check that your home directory is writable on this node", path
            ) from None
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        raise AddressFileError(f"{path} does not exist", path) from None
    except OSError as exc:
        raise AddressFileError(
            f"cannot open {path} ({exc.strerror}): it must be a directory of yours, not a symlink", path
        ) from None
    info = os.fstat(fd)
    if info.st_uid != os.getuid():
        os.close(fd)
        raise AddressFileError(f"{path} belongs to uid {info.st_uid}, not to you: remove it", path)
    if stat.S_IMODE(info.st_mode) != 0o700:
        if not create:
            os.close(fd)
            raise AddressFileError(
                f"{path} has mode {stat.S_IMODE(info.st_mode):o}: others may see your server's token; chmod 700 it",
                path,
            )
        os.fchmod(fd, 0o700)
    return fd


def _open_serve_dir(environ: Mapping[str, str], create: bool) -> int:
    home = os.path.dirname(os.path.dirname(serve_dir(environ)))
    try:
        home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # $HOME itself may be a link
    except OSError as exc:
        raise AddressFileError(
            f"home directory {home} cannot be opened ({exc.strerror}): set HOME to a private directory of yours", home
        ) from None
    try:
        top = _own_private_dir(home_fd, DIR_PARTS[0], os.path.join(home, DIR_PARTS[0]), create)
    finally:
        os.close(home_fd)
    try:
        return _own_private_dir(top, DIR_PARTS[1], serve_dir(environ), create)
    finally:
        os.close(top)


def write_address(address: Address, environ: Mapping[str, str] = os.environ) -> str:
    """Publish ``address`` to ``~/.slurm-tpu/serve/<jobid>.json`` (0600, atomically); its path."""
    _check_job_id(address.job_id)
    path = address_path(address.job_id, environ)
    dir_fd = _open_serve_dir(environ, create=True)
    temporary = f".{address.job_id}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        try:
            fd = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
        except OSError as exc:
            raise AddressFileError(
                f"cannot create the address file in {serve_dir(environ)} ({exc.strerror})", path
            ) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(encode(address))
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(temporary, file_name(address.job_id), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return path


def remove_address(address: Address, environ: Mapping[str, str] = os.environ) -> None:
    """Remove the address file if it is still this server's (a requeued job may have replaced it)."""
    try:
        if read_address(address.job_id, environ).token != address.token:
            return
        dir_fd = _open_serve_dir(environ, create=False)
    except SlurmTpuError:
        return
    try:
        with contextlib.suppress(OSError):
            os.unlink(file_name(address.job_id), dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def read_address(job_id: str, environ: Mapping[str, str] = os.environ) -> Address:
    """The address file of job ``job_id`` (yours, 0600, no links), or an error saying why not."""
    _check_job_id(job_id)
    path = address_path(job_id, environ)
    try:
        dir_fd = _open_serve_dir(environ, create=False)
    except AddressFileError as exc:
        raise AddressFileError(
            f"no server address for job {job_id} ({exc}): is 'slurm-tpu serve' running in that job, as you?", path
        ) from None
    try:
        fd = os.open(file_name(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        raise AddressFileError(
            f"no server address for job {job_id} ({path} does not exist): is 'slurm-tpu "
            "serve' running in that job (squeue -j), and did it start?",
            path,
        ) from None
    except OSError as exc:
        raise AddressFileError(f"cannot open {path} ({exc.strerror})", path) from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise AddressFileError(f"{path} is not a private file of yours (mode 0600): not trusted", path)
        raw = handle.read(65536)
    try:
        return decode(raw, path)
    except FormatError as exc:
        raise AddressFileError(str(exc), path) from None


def find_address(host_port: str, environ: Mapping[str, str] = os.environ) -> Address | None:
    """The address file of yours that names ``host:port``, if any."""
    try:
        dir_fd = _open_serve_dir(environ, create=False)
    except SlurmTpuError:
        return None
    try:
        names = [n for n in os.listdir(dir_fd) if n.endswith(SUFFIX)]
    finally:
        os.close(dir_fd)
    for name in sorted(names):
        try:
            address = read_address(name[: -len(SUFFIX)], environ)
        except SlurmTpuError:
            continue
        if address.host_port == host_port:
            return address
    return None
