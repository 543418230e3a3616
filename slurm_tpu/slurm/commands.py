"""Slurm's command-line tools as one object: the gateway every scontrol/squeue call goes through.

Programs come from one installation (``installation.py``), run by ``spawn.py``; a failure
raises SlurmCommandError, or SlurmVersionError naming both versions when the client is
another release than the daemons. Light enough for the hooks. Draining and resuming are
written once, in :class:`NodeStates`, for this class and pyslurm (``backend.py``) alike.
"""

from __future__ import annotations

from ..errors import SlurmCommandError, SlurmVersionError
from . import installation as _installation
from .spawn import run as _spawn

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..config import Config
    from .jobdetail import GresAlloc
    from .parse import NodeState

# A reason is for an admin to read in `sinfo -R`/`scontrol show node`: one line, and short
# enough to read (the epilog's list of surviving processes can be long).
MAX_REASON = 400
NO_REASON = "slurm-tpu: no reason given"


def node_reason(text: str, limit: int = MAX_REASON) -> str:
    """``text`` as a drain reason Slurm stores and shows back unchanged.

    Control characters (a process name in it is a user's choice: newlines would forge
    lines of ``scontrol show node`` output) and runs of white space become one space; the
    double quotes scontrol strips from either end are dropped; a longer one is cut to
    ``limit`` (at most MAX_REASON) ending in ``...``. Never empty (Slurm refuses to drain
    without a reason); idempotent, so it can be compared with what Slurm reports.
    """
    printable = "".join(c if c.isprintable() else " " for c in text)
    cleaned = " ".join(printable.split()).strip('"').strip()
    limit = min(limit, MAX_REASON)
    if len(cleaned) > limit:
        cleaned = cleaned[: limit - 3].rstrip() + "..."
    return cleaned or NO_REASON


class NodeStates:
    """drain/resume, written once for every way of talking to Slurm (scontrol, pyslurm)."""

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        raise NotImplementedError

    def drain(self, node: str, reason: str) -> None:
        """Drain ``node``: no new jobs, running ones finish; ``reason`` cleaned by node_reason()."""
        self._update_node(node, "DRAIN", node_reason(reason))

    def resume(self, node: str) -> None:
        """Return a drained ``node`` to service."""
        self._update_node(node, "RESUME", None)


class Slurm(NodeStates):
    """Slurm's command-line tools, from one installation."""

    name = "scontrol"

    def __init__(
        self,
        install: _installation.Installation | None = None,
        environ: Mapping[str, str] | None = None,
        timeout: float = 20.0,
        detail_source: Callable[[str, str], str | None] | None = None,
    ):
        """``detail_source``: (scontrol path, selector) -> ``scontrol show job -d``'s text, tried first
        (the node agent's resident scontrol, hooks/agent_query.py), or None to run scontrol here."""
        import os

        self.environ = os.environ if environ is None else environ
        self.install = install or _installation.find(self.environ)
        self.timeout = timeout
        self.detail_source = detail_source

    @classmethod
    def for_config(cls, config: Config, environ: Mapping[str, str] | None = None) -> Slurm:
        """The gateway for an admin command: env override, config keys, running slurmd, PATH, defaults."""
        return cls(_installation.find(environ, config.slurm_bin_dir, config.slurm_sbin_dir), environ)

    def program(self, name: str) -> str:
        """Absolute path of a Slurm program of this installation."""
        return self.install.program(name)

    def run(self, name: str, *args: str, timeout: float | None = None) -> str:
        """stdout of Slurm program ``name`` with ``args``; SlurmCommandError (or SlurmVersionError)."""
        program = self.program(name)
        try:
            return _spawn([program, *args], dict(self.environ), self.timeout if timeout is None else timeout)
        except SlurmCommandError as exc:
            mismatch = _installation.version_mismatch(self.install, program, self.environ)
            if mismatch:
                raise SlurmVersionError(mismatch, program, exc.stderr) from exc
            raise

    # ---- jobs --------------------------------------------------------------------
    def job_gres(self, job_id: int, node: str) -> list[GresAlloc] | None:
        """Job ``job_id``'s GRES on ``node`` (None: not on the node; ValueError: unparseable).

        One ``scontrol show job -d`` in the usual case; a second, narrowed to the job alone,
        when other tasks of its array share the node; ``squeue --json`` only when the text
        was forged (see ``jobdetail.parse_scontrol_job_detail``).
        """
        from .jobdetail import ForgedOutputError, SiblingsOnNode, parse_scontrol_job_detail

        text = self.job_detail(str(job_id))
        try:
            try:
                return parse_scontrol_job_detail(text, node, job_id)
            except SiblingsOnNode as siblings:
                return parse_scontrol_job_detail(self.job_detail(siblings.selector), node, job_id, narrowed=True)
        except ForgedOutputError:
            from .parse import parse_squeue_job_json

            return parse_squeue_job_json(self.squeue_json(job_id), job_id, node)

    def job_detail(self, selector: str) -> str:
        """``scontrol show job -d SELECTOR`` (``123``, ``123_4`` an array task, ``123+1`` a het component)."""
        if self.detail_source is not None:
            text = self.detail_source(self.program("scontrol"), selector)
            if text:
                return text
        # --local: this node's job is this cluster's; without it every query also costs the
        # controller a REQUEST_FED_INFO RPC (slurm_load_job asks for the federation first).
        return self.run("scontrol", "--local", "show", "job", "-d", selector)

    def job_state(self, job_id: str) -> str:
        """Job ``job_id``'s state (``RUNNING``, ``COMPLETED``...; the first line for an array), ''
        when Slurm no longer knows the job. SlurmCommandError when Slurm cannot be asked."""
        try:
            out = self.run("squeue", "-h", "-j", job_id, "-o", "%T")
        except SlurmCommandError as exc:
            if "Invalid job id" in exc.stderr:  # slurm_load_jobs' answer for a job past MinJobAge
                return ""
            raise
        lines = out.split()
        return lines[0] if lines else ""

    def squeue_json(self, job_id: int) -> str:
        """``squeue --json -j JOB`` (22.05 ignores -j and lists every job)."""
        return self.run("squeue", "--json", "-j", str(job_id))

    def jobs_with_gres(self, node: str) -> list[str]:
        """Ids of running/completing jobs on ``node`` that asked for a GRES."""
        out = self.run("squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i %b")
        jobs = []
        for line in out.splitlines():
            job, _, gres = line.strip().partition(" ")
            if job and gres.strip() not in ("", "N/A", "(null)"):
                jobs.append(job)
        return jobs

    # ---- nodes -------------------------------------------------------------------
    def node_state(self, node: str) -> NodeState:
        """State, reason and GRES of ``node`` (``scontrol -o show node``)."""
        from .parse import parse_node_state

        return parse_node_state(self.run("scontrol", "-o", "show", "node", node))

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        # Each an argument of its own, never seen by a shell: scontrol splits each at its first '='.
        self.run(
            "scontrol",
            "update",
            f"NodeName={node}",
            f"State={state}",
            *([f"Reason={reason}"] if reason is not None else []),
        )

    def hardware(self, slurmd: str | None = None) -> dict[str, str]:
        """This node's CPU and memory facts from ``slurmd -C`` (``slurmd``: an explicit binary)."""
        from .parse import parse_slurmd_c

        if not slurmd:
            return parse_slurmd_c(self.run("slurmd", "-C"))
        if "/" not in slurmd:
            slurmd = "./" + slurmd  # a path the admin typed, never a name to look up
        return parse_slurmd_c(self.run_command([slurmd, "-C"]))

    # ---- an admin's commands -----------------------------------------------------
    def run_command(self, argv: Sequence[str], timeout: float | None = None) -> str:
        """stdout of an admin's command (restart slurmd...), found by ``Installation.command``, no shell."""
        if not argv:
            raise SlurmCommandError("empty command: give a program and its arguments", "")
        program = self.install.command(argv[0], self.environ)
        return _spawn([program, *argv[1:]], dict(self.environ), self.timeout if timeout is None else timeout)
