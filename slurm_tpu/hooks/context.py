"""What every hook needs: the job from the environment, the config, messages."""

from __future__ import annotations

import sys

# Annotations only: typing costs the hooks milliseconds per job at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TAG = "slurm-tpu"


class HookError(Exception):
    """A hook cannot do its work; the message is the one line to log."""


def say(message: str, error: bool = True) -> None:
    """One line to stderr (slurmd logs it) and to syslog (the admin's trail)."""
    line = f"{TAG}: {message}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
    try:
        import syslog

        syslog.openlog(TAG, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, message)
    except OSError:
        pass


def drain(node: str, reason: str, settings, environ, hook: str) -> bool:
    """Drain ``node`` with ``reason`` through the Slurm gateway (``Slurm.drain``); False, said, when Slurm refuses.

    Our own reason is more useful than Slurm's generic "Prolog error"/"Epilog error".
    """
    from ..errors import SlurmCommandError

    try:
        settings.slurm(environ).drain(node, reason)
        return True
    except SlurmCommandError as exc:
        say(f"{hook}: cannot drain {node}: {exc}")
        return False


def load_hook_config(environ: Mapping[str, str]):  # -> Config
    """The site config named by the hook's environment (or the default path).

    yaml is imported only when a config file exists. Hooks run under
    ``python3 -I -S`` for a fast start, which leaves site-packages (and so
    PyYAML) off sys.path: add it only when it is needed.
    """
    import os

    from ..config import Config, load_config
    from ..defaults import CONFIG_ENV, CONFIG_PATH

    path = environ.get(CONFIG_ENV) or CONFIG_PATH
    if path == CONFIG_PATH and not os.path.exists(path):
        return Config()
    try:
        return load_config(path)
    except ImportError:
        import site

        site.main()
        return load_config(path)


class JobContext:
    """The job a prolog/epilog/task-prolog runs for, from Slurm's environment."""

    __slots__ = ("job_id", "uid", "user", "node")

    def __init__(self, job_id: int, uid: int | None, user: str, node: str):
        self.job_id, self.uid, self.user, self.node = job_id, uid, user, node


def _number(environ: Mapping[str, str], name: str, required: bool) -> int | None:
    text = environ.get(name, "")
    if not text:
        if required:
            raise HookError(f"{name} is not set: run this as Slurm's Prolog/Epilog/TaskProlog")
        return None
    if not text.isdigit() or len(text) > 10:
        raise HookError(
            f"{name}={text[:40]!r} is not a number; refusing to lease devices for it (check slurmd's environment)"
        )
    return int(text)


def node_from_env(environ: Mapping[str, str]) -> str | None:
    """SLURMD_NODENAME (slurmd sets it for hooks and tasks), if valid."""
    node = environ.get("SLURMD_NODENAME", "")
    return node if node and node.isprintable() and " " not in node and "/" not in node else None


def job_from_env(environ: Mapping[str, str], node: str, need_uid: bool = True) -> JobContext:
    """Parse SLURM_JOB_ID / SLURM_JOB_UID (set by slurmd, not the job)."""
    job_id = _number(environ, "SLURM_JOB_ID", True)
    uid = _number(environ, "SLURM_JOB_UID", need_uid)
    user = environ.get("SLURM_JOB_USER", "")
    assert job_id is not None
    return JobContext(job_id, uid, user if user.isprintable() else "", node)


def run_guarded(name: str, run, environ) -> int:
    """Run a hook's ``run(environ)``; any failure becomes one line and exit status 1.

    Slurm drains the node on a failing prolog/epilog; the line says why, never a
    traceback (SlurmTpuError, OSError... included).
    """
    try:
        return run(environ)
    except HookError as exc:
        say(f"{name}: {exc}")
    except Exception as exc:  # noqa: BLE001 - one line, whatever went wrong
        say(f"{name}: job {environ.get('SLURM_JOB_ID', '?')}: {type(exc).__name__}: {exc}")
    return 1
