"""The node agent's power sampler: polled power integrated per job, for devices without an energy counter.

A GPU without NVML's energy counter (``nvml-power:<bus id>``, before Volta) or an AMD GPU with a
hwmon power file (``hwmon-power:<path>``) gives only its power now. Every ``poll_seconds`` the
sampler lists the Prolog's start files in ``<state_dir>/energy/`` (protocol/energy.py), reads the
power of each such device of each job, and replaces the job's ``<job>.poll`` with the running
integral (:class:`~slurm_tpu.protocol.energy.PollState`): trapezoids between samples; before the
first sample, the first reading over the stretch since the job's start (``start_ns``), so a job is
not short of its first few seconds. The Epilog adds the stretch after the last sample and removes
both files.

Robust by construction: a start file that does not decode, a poll file that does not (left as it
is: the Epilog then says the figure is unavailable, rather than the sampler restarting it from
zero), a device that gives no reading, an NVML error: each costs that job's samples, never the
sampler, and is logged once (again only when it changes). One NVML is kept open for the sampler's
life (its initialisation can take a second on a GPU without persistence mode) and reopened after
an error. Files are root's 0600, written atomically through access/statedir.py, never through a
link. A poll file whose start file is gone (the Epilog removed it between our read and our
write) is removed; one of an earlier run of the job id (a requeued job: our write raced its
Epilog and its next Prolog) names that run's start, and is restarted from this run's.

The node agent runs it in a child process of its own (hooks/agent.py: a thread in the agent
would make every later fork of a hook worker a fork of a threaded process, and an NVML that hangs
or crashes must not take the agent with it): :func:`serve` is that child's life, ending with the
agent. :meth:`Sampler.poll_once` is one pass, which the tests call directly.
"""

from __future__ import annotations

import os
import sys
import time

from ..defaults import NVML_LIBRARY, SYSFS_ROOT
from ..protocol.energy import (
    DIR,
    HWMON_POWER,
    MAX_BYTES,
    MAX_JOULES,
    MAX_WATTS,
    NVML_POWER,
    POLL_SUFFIX,
    PollState,
    decode,
    decode_poll,
    encode_poll,
)
from .figures import boot_id, clock_ns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..protocol.energy import StartDevice, StartFile
    from .nvml import Nvml

POLLED = (NVML_POWER, HWMON_POWER)


def _stderr(message: str) -> None:
    print(f"slurm-tpu: {message}", file=sys.stderr, flush=True)


class Sampler:
    """One node's power sampler (one per agent; not shared between threads).

    ``state_dir``: the hooks' state directory; ``poll_seconds``: the period :func:`serve` keeps;
    ``nvml_library``: NVML's soname or path; ``sysfs_root``: where hwmon paths must resolve;
    ``log``: one line per problem (the agent's ``say``); ``clock``/``boot``: CLOCK_BOOTTIME ns and
    the boot id (the tests give their own)."""

    def __init__(
        self,
        state_dir: str,
        poll_seconds: float,
        nvml_library: str = NVML_LIBRARY,
        sysfs_root: str = SYSFS_ROOT,
        log: Callable[[str], None] = _stderr,
        clock: Callable[[], int] = clock_ns,
        boot: str | None = None,
    ):
        if not poll_seconds > 0:  # NaN too: a period that never waits would spin
            raise ValueError(f"the energy sampler's period must be over 0 s, not {poll_seconds!r}")
        self.state_dir, self.poll_seconds, self.nvml_library = state_dir, float(poll_seconds), nvml_library
        self.sysfs_root, self._log, self._clock = sysfs_root, log, clock
        self.boot = boot_id() if boot is None else boot
        self._nvml: Nvml | None = None
        self._nvml_failed = False  # this pass: NVML would not open (not tried again until the next)
        self._said: dict[str, str] = {}  # what -> the last line logged about it (each problem once)

    # ---- one pass

    def poll_once(self) -> int:
        """Sample every polled device of every job with a start file now; the number of poll files
        written. Never raises (a problem is logged and costs that job's samples)."""
        from ..access import statedir

        self._nvml_failed = False
        seen: set[str] = set()
        written = 0
        try:
            state_fd = statedir.open_dir(self.state_dir)
        except statedir.StateDirError as exc:
            self._say("state", f"energy sampler: {exc}")
            return 0
        try:
            try:
                fd = statedir.open_dir(DIR, parent_fd=state_fd, mode=0o700)
            except statedir.StateDirError as exc:
                if os.path.lexists(os.path.join(self.state_dir, DIR)):
                    self._say("dir", f"energy sampler: {exc}")
                return 0  # no job has a start file here yet
            try:
                names = os.listdir(fd)
                for name in names:
                    if name.isdigit():
                        seen.add(name)
                        try:
                            written += self._poll_job(fd, name)
                        except Exception as exc:  # noqa: BLE001 - one job's samples, never the sampler
                            self._say(name, f"energy sampler: job {name}: {type(exc).__name__}: {exc}")
                    elif name.endswith(POLL_SUFFIX) and name[: -len(POLL_SUFFIX)] not in names:
                        statedir.remove(fd, name)  # its job ended while we wrote it (see _poll_job)
            finally:
                os.close(fd)
        except Exception as exc:  # noqa: BLE001 - the listing itself: try again next period
            self._say("dir", f"energy sampler: {type(exc).__name__}: {exc}")
        finally:
            os.close(state_fd)
        # Forget what was said about jobs that ended: bounded, and a new job with an old id is told anew.
        for key in [key for key in self._said if key.partition(":")[0].isdigit() and key.partition(":")[0] not in seen]:
            del self._said[key]
        return written

    def _poll_job(self, fd: int, name: str) -> int:
        """Sample job ``name``'s polled devices and replace its poll file; 1 if written, else 0."""
        from ..access import statedir
        from ..protocol import FormatError

        raw = statedir.read_file(fd, name, MAX_BYTES, owner=0)
        if raw is None:
            return 0  # gone since the listing: its job ended
        start = decode(raw, f"{DIR}/{name}")
        polled = [device for device in start.devices if device.source_kind in POLLED]
        if not polled:
            return 0
        if start.boot != self.boot:
            self._say(name, f"energy sampler: job {name}'s start file is from another boot: not sampled")
            return 0
        poll_name = name + POLL_SUFFIX
        raw = statedir.read_file(fd, poll_name, MAX_BYTES, owner=0)
        try:
            before = {} if raw is None else decode_poll(raw, f"{DIR}/{poll_name}")
        except FormatError as exc:
            # Not restarted from zero (an integral short of the job's start): the Epilog says unavailable.
            self._say(name, f"energy sampler: {exc}: left as it is, job {name} is not sampled")
            return 0
        if not all(state.of_run(start) for state in before.values()):
            before = {}  # an earlier run's samples (a requeued job id): this run starts from its own start
        states: list[PollState] = []
        for device in polled:
            watts = self._power(name, device)
            now = self._clock()
            last = before.get(device.identity)
            if watts is not None:
                last = _advance(last, device.identity, start, now, watts)
            if last is not None:
                states.append(last)
        if not states or all(before.get(s.identity) is s for s in states):
            return 0  # nothing new to say
        statedir.write_atomic(fd, poll_name, encode_poll(states), 0o600)
        try:
            os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            statedir.remove(fd, poll_name)  # the Epilog took the job's files meanwhile: leave nothing behind
            return 0
        return 1

    def _power(self, job: str, device: StartDevice) -> float | None:
        """The device's power now (W), or None (logged once, until a good reading) when it gives none."""
        key = f"{job}:{device.identity}"
        watts, why = self._read_power(device)
        if watts is None:
            if why:
                self._say(key, f"energy sampler: job {job}: {why}")
            return None
        self._said.pop(key, None)  # a problem that comes back later is said again
        return watts

    def _read_power(self, device: StartDevice) -> tuple[float | None, str]:
        """(watts, '') or (None, why there is no reading; '' when NVML itself would not open: said once)."""
        from .nvml import Nvml, NvmlError

        argument = device.source_argument
        if device.source_kind == HWMON_POWER:
            from .hwmon import power_w

            watts = power_w(argument, self.sysfs_root)
            return (watts, "") if watts is not None else (None, f"{device.identity}: no power in {argument}")
        if self._nvml is None:
            if self._nvml_failed:
                return None, ""
            try:
                self._nvml = Nvml(self.nvml_library)
            except NvmlError as exc:
                self._nvml_failed = True
                self._say("nvml", f"energy sampler: {exc}")
                return None, ""
            self._said.pop("nvml", None)
        try:
            watts = self._nvml.power_w(argument)
        except NvmlError as exc:
            self._close_nvml()  # opened again for the next device: a driver reloaded meanwhile is found anew
            return None, str(exc)
        if watts is None:
            return None, f"{device.identity}: NVML has no power reading for GPU {argument}"
        if not 0 <= watts <= MAX_WATTS:
            return None, f"{device.identity}: {watts} W from NVML is not a reading"
        return watts, ""

    def _say(self, what: str, message: str) -> None:
        """Log ``message`` unless it is what was last said about ``what``."""
        if self._said.get(what) != message:
            self._said[what] = message
            try:
                self._log(message)
            except Exception:  # noqa: BLE001 - a log that fails costs the line only
                pass

    def _close_nvml(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            nvml.close()

    def close(self) -> None:
        """Shut NVML down (if it was opened)."""
        self._close_nvml()


def _advance(last: PollState | None, identity: str, start: StartFile, now: int, watts: float) -> PollState:
    """``last`` with the sample ``watts`` at ``now`` added: a trapezoid since the last sample, or, for
    the first, the first reading over the stretch since the job's start (the Epilog refuses a stretch
    of more than a few periods: ``first_ns``/``gap_ns`` say how long they were)."""
    if last is None:
        joules = watts * max(0, now - start.start_ns) / 1e9
        return PollState(identity, min(joules, MAX_JOULES), 1, now, watts, now, 0, start.start_ns, start.boot)
    stretch_ns = max(0, now - last.last_ns)
    joules = last.joules + (last.last_watts + watts) / 2 * stretch_ns / 1e9
    first = last.last_ns if last.first_ns is None else last.first_ns
    return PollState(
        identity,
        min(joules, MAX_JOULES),
        last.samples + 1,
        max(now, last.last_ns),
        watts,
        first,
        max(last.gap_ns, stretch_ns),
        start.start_ns,
        start.boot,
    )


# ---- the agent's sampler process


def serve(agent_pid: int, sampler: Sampler) -> None:
    """The sampler process's life: a pass every ``poll_seconds`` until the agent ``agent_pid`` (its
    parent) ends; returns then. Its wait is on the agent's pidfd (readable once the agent exited), so
    an agent that dies, even by SIGKILL, leaves no sampler behind; where the kernel has no pidfd
    (before 5.3), the parent's pid is checked each period instead."""
    import select

    try:
        watch: int | None = os.pidfd_open(agent_pid)
    except (AttributeError, OSError):
        watch = None
    try:
        while os.getppid() == agent_pid:
            began = time.monotonic()
            sampler.poll_once()
            left = max(0.0, sampler.poll_seconds - (time.monotonic() - began))
            if watch is None:
                time.sleep(left)
            elif select.select([watch], [], [], left)[0]:
                return  # the agent ended
    finally:
        sampler.close()
        if watch is not None:
            os.close(watch)
