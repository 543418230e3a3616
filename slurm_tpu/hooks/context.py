"""What every hook needs: the job from the environment, its run, messages."""

from __future__ import annotations

import sys

from .probe import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .settings import HookSettings

TAG = "slurm-tpu"


class HookError(Exception):
    """A hook cannot do its work; the message is the one line to log."""


def say(message: str, error: bool = True) -> None:
    """One line to stderr (slurmd logs it) and to syslog (the admin's trail)."""
    try:
        sys.stderr.write(f"{TAG}: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass
    try:
        import syslog

        syslog.openlog(TAG, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, message)
    except OSError:
        pass


def audit_or_say(ledger, hook: str, event: str, **fields) -> None:
    """An audit line of ``hook`` (prolog, epilog) that must not fail it: one that cannot be written (a
    full state filesystem) goes to stderr and syslog instead, with its reason where it has one."""
    try:
        ledger.audit(event, **fields)
    except Exception as exc:  # noqa: BLE001 - the line is a record, never the job's or the node's fate
        reason = f": {fields['reason']}" if fields.get("reason") else ""
        say(f"{hook}: job {fields.get('job_id')}: {event}{reason} (not audited: {exc})"[:1000], error=False)


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


class HookRun:
    """One run of a root hook: what it was given and what it finds, built at its entry and passed down.
    A node agent's worker runs hook after hook, so whatever a hook learns lives here and ends
    with the run: no hook module keeps state of its own from one hook to the next."""

    __slots__ = ("hook", "environ", "node", "settings", "job", "probe", "detail_source", "_slurm")
    # Set by the hook once it has read them (its first steps).
    settings: HookSettings
    job: JobContext

    def __init__(self, hook: str, environ: Mapping[str, str], probe: Probe | None = None, detail_source=None):
        """``probe``: the run's timing (hooks/probe.py; by default from ``environ``). ``detail_source``:
        the node agent's resident scontrol for this hook (``Slurm.detail_source``)."""
        self.hook, self.environ, self.detail_source = hook, environ, detail_source
        self.probe = probe if probe is not None else Probe(environ)
        self.node = node_from_env(environ)
        self._slurm = None

    def slurm(self):  # -> slurm.commands.Slurm
        """This run's Slurm gateway (found once per run: see ``HookSettings.slurm``)."""
        if self._slurm is None:
            self._slurm = self.settings.slurm(self.environ, self.detail_source)
        return self._slurm

    def drain(self, node: str, reason: str) -> bool:
        """Drain ``node`` with ``reason`` (more useful than Slurm's generic "Prolog error"/"Epilog error");
        False, said, when Slurm refuses."""
        from ..errors import SlurmCommandError

        try:
            self.slurm().drain(node, reason)
            return True
        except SlurmCommandError as exc:
            say(f"{self.hook}: cannot drain {node}: {exc}")
            return False

    def main(self, run, *args) -> int:
        """``run(self, *args)``'s exit status, or 1 after one line for its failure (never a traceback);
        the probe's line is written either way."""
        try:
            return run(self, *args)
        except Exception as exc:  # noqa: BLE001 - one line, whatever went wrong
            job = self.environ.get("SLURM_JOB_ID", "?")
            message = str(exc) if isinstance(exc, HookError) else f"job {job}: {type(exc).__name__}: {exc}"
            say(f"{self.hook}: {message}")
            # Slurm drains the node of a failing prolog or epilog with a reason of its own ("Prolog error"),
            # which names nothing: drain it first with this line (once the run has read its settings, which
            # say how to reach Slurm).
            if self.hook in ("prolog", "epilog") and self.node is not None and hasattr(self, "settings"):
                self.drain(self.node, f"{TAG}: {self.hook}: {message}")
        finally:
            self.probe.finish(self.hook)
        return 1
