"""A job's energy on each accelerator it holds on a node: the Prolog's start readings and the
Epilog's figures (protocol/energy.py names the methods and the start file).

The Prolog calls :func:`start_readings` with every device the job holds here and its source (the
hooks snapshot's ``energy_sources``); the Epilog calls :func:`device_figures` with the start file,
the sampler's poll file, and the busy time it knows (:func:`busy_times`). Both read the devices
themselves (NVML through :mod:`slurm_tpu.energy.nvml`, hwmon through :mod:`slurm_tpu.energy.hwmon`),
imported only when a device needs them. Nothing here raises for a device: a reading that cannot be
had costs that device's figure (``unavailable`` with a note), never the job.
"""

from __future__ import annotations

import os
import time

from ..defaults import SYSFS_ROOT
from ..protocol.energy import (
    DIR,
    ESTIMATED,
    HWMON_POWER,
    INTEGRATED,
    MAX_BYTES,
    MAX_JOULES,
    MEASURED,
    MODEL,
    NO_SOURCE,
    NVML_ENERGY,
    NVML_POWER,
    POLL_SUFFIX,
    SELF_REPORTED,
    UNAVAILABLE,
    DeviceEnergy,
    PollState,
    StartDevice,
    StartFile,
    decode,
    decode_poll,
    encode,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

BOOT_ID = "/proc/sys/kernel/random/boot_id"
# No accelerator draws more: a counter delta beyond this many watts over the job is a corrupt or
# forged reading (a counter that jumped), refused whole rather than put in the job's record.
MAX_DEVICE_W = 10_000.0
NO_AGENT = "no node agent polls power here"


def boot_id() -> str:
    """This boot's id ('' when the kernel does not say): a reboot between start and end ends the figure,
    and the sampler does not sample a start file of another boot (its CLOCK_BOOTTIME times mean nothing now)."""
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def clock_ns() -> int:
    """CLOCK_BOOTTIME in ns: counts suspend, never steps with the wall clock."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def open_nvml(library: str):  # -> tuple[Nvml | None, str]
    """An initialised NVML from ``library`` and '', or None and why not (one line)."""
    from .nvml import Nvml, NvmlError

    try:
        return Nvml(library), ""
    except NvmlError as exc:
        return None, str(exc)
    except OSError as exc:  # a library that is not one (ctypes' own error)
        return None, f"{library}: {exc}"


class _NvmlOnDemand:
    """One NVML per hook run, opened at the first device that needs it (never for Edge TPUs)."""

    __slots__ = ("library", "handle", "why", "opened")

    def __init__(self, library: str, handle=None):
        self.library, self.handle, self.why, self.opened = library, handle, "", handle is not None

    def get(self):  # -> Nvml | None (then ``why`` says why)
        if not self.opened:
            self.opened = True
            self.handle, self.why = open_nvml(self.library)
        return self.handle

    def close(self, mine: bool) -> None:
        if mine and self.handle is not None:
            try:
                self.handle.close()
            except Exception:  # noqa: BLE001 - a shutdown that fails costs nothing here
                pass


def start_readings(
    job_id: int,
    devices: list[StartDevice],
    library: str,
    nvml=None,
    deadline_s: float | None = None,
    uid: int = -1,
) -> tuple[StartFile, list[str]]:
    """The job's start file from ``devices`` (identity, kind, source, shares; ``start`` unset), each
    counter read now, and the problems met (one line each, for the audit log). ``nvml``: an open NVML
    to use in this process (the caller's); else the counters are read in a child process with a
    deadline (energy/guard.py: ``deadline_s``, default its READ_DEADLINE_S), only when a device has one.
    ``uid``: the job's user (the metrics label a running job's figures with it; -1: unknown).

    A GPU whose counter NVML does not support (pre-Volta) becomes ``nvml-power`` (the agent's sampler
    polls its power); a reading that fails, hangs or crashes becomes ``none:<why>``, so the Epilog says why."""
    counters = [device for device in devices if device.source_kind == NVML_ENERGY]
    taken: dict[str, tuple[str, float | None, str]] = {}
    if counters and nvml is not None:
        taken = _counter_starts(counters, library, nvml)
    elif counters:
        from . import guard

        _prepare_child()

        value, why = guard.call(
            lambda: _counter_starts(counters, library), "NVML at job start", deadline_s or guard.READ_DEADLINE_S
        )
        failed: dict[str, tuple[str, float | None, str]] = {d.identity: (_none(why), None, why) for d in counters}
        taken = value if isinstance(value, dict) else failed
    problems: list[str] = []
    found: list[StartDevice] = []
    for device in devices:
        source, start, problem = taken.get(device.identity, (device.source, None, ""))
        if problem:
            problems.append(f"{device.identity}: {problem}")
        found.append(StartDevice(device.identity, device.kind, source, start, device.shares))
    return StartFile(job_id, boot_id(), clock_ns(), found, uid), problems


def _prepare_child() -> None:
    """Import here what every guarded read imports (ctypes, the NVML binding, the hwmon reader): once per
    process, shared by each child through the fork, rather than again in every child. The vendor library
    itself is loaded only in the child (its constructors may hang or crash too)."""
    import ctypes  # noqa: F401

    from . import hwmon, nvml  # noqa: F401


def _counter_starts(devices: list[StartDevice], library: str, nvml=None) -> dict[str, tuple[str, float | None, str]]:
    """identity -> (source, start mJ, problem) of ``nvml-energy`` devices (plain values: a guarded child's answer)."""
    handle = _NvmlOnDemand(library, nvml)
    try:
        return {device.identity: _counter_start(handle, device) for device in devices}
    finally:
        handle.close(mine=nvml is None)


def _counter_start(handle: _NvmlOnDemand, device: StartDevice) -> tuple[str, float | None, str]:
    """(source, start mJ, problem) of an ``nvml-energy`` device."""
    from .nvml import NvmlError

    bus_id = device.source_argument
    nvml = handle.get()
    if nvml is None:
        return _none(f"NVML at job start: {handle.why}"), None, handle.why
    try:
        reading = nvml.energy_mj(bus_id)
    except NvmlError as exc:
        return _none(f"NVML at job start: {exc}"), None, str(exc)
    if reading is None:
        return f"{NVML_POWER}:{bus_id}", None, ""  # no counter (pre-Volta): polled power instead
    return device.source, float(reading), ""


def _none(why: str) -> str:
    """A ``none:`` source carrying ``why`` (one line, no tab: it goes into the start file)."""
    return f"{NO_SOURCE}:" + " ".join(why.split())[:200]


def busy_times(
    start: StartFile, reported: Mapping[str, float], broker_busy_ms: float | None
) -> dict[str, tuple[float, str, str]]:
    """identity -> (busy seconds, method, note) of the job's modelled devices: the TPU broker's busy
    time for its shared TPUs (root's measurement: ``estimated``; split evenly over the node's shared
    TPUs the job held shares of, as the broker schedules a job on any of them), else the job's own
    usage record's seconds (``self-reported``). A device with neither is left out (idle power only)."""
    shared = [d.identity for d in start.devices if d.shares is not None and d.source_kind == MODEL]
    found: dict[str, tuple[float, str, str]] = {}
    if shared and broker_busy_ms is not None and 0 <= broker_busy_ms < float("inf"):
        each = broker_busy_ms / 1000.0 / len(shared)
        for identity in shared:
            found[identity] = (each, ESTIMATED, "busy time measured by the node's TPU broker")
    for identity, seconds in reported.items():
        if identity not in found and 0 <= seconds < float("inf"):
            found[identity] = (seconds, SELF_REPORTED, "busy time reported by the job (bounded by its allocation)")
    return found


# The sources whose figure needs a reading of the device at the job's end (NVML or hwmon).
READ_AT_END = (NVML_ENERGY, NVML_POWER, HWMON_POWER)
# A polled figure is not stretched over more than this many sampler periods without a sample (an agent
# that was down, a sampler stuck on a slow NVML): the figure is then unavailable.
GAP_PERIODS = 3


def end_readings(
    start: StartFile, library: str, sysfs_root: str = SYSFS_ROOT, nvml=None, deadline_s: float | None = None
) -> dict[str, tuple[float | None, str]]:
    """identity -> (reading, note) of the start file's devices read at the job's end, taken now: an
    ``nvml-energy`` device's counter (mJ), an ``nvml-power``/``hwmon-power`` device's power (W); None and
    why when there is none. ``nvml``: an open NVML to use in this process (the caller's); else the reads
    run in a child process with a deadline (energy/guard.py), and only when a device needs one: a read
    that hangs or crashes costs those devices' readings, never the caller."""
    wanted = [device for device in start.devices if device.source_kind in READ_AT_END]
    if not wanted:
        return {}
    if nvml is not None:
        return _end_values(wanted, library, sysfs_root, nvml)
    from . import guard

    _prepare_child()

    value, why = guard.call(
        lambda: _end_values(wanted, library, sysfs_root),
        "the device reads at job end",
        deadline_s or guard.READ_DEADLINE_S,
    )
    if isinstance(value, dict):
        return value
    return {device.identity: (None, why) for device in wanted}


def _end_values(
    devices: list[StartDevice], library: str, sysfs_root: str, nvml=None
) -> dict[str, tuple[float | None, str]]:
    """:func:`end_readings`' values, read in this process (plain values: a guarded child's answer)."""
    handle = _NvmlOnDemand(library, nvml)
    try:
        return {device.identity: _end_value(device, handle, sysfs_root) for device in devices}
    finally:
        handle.close(mine=nvml is None)


def _end_value(device: StartDevice, handle: _NvmlOnDemand, sysfs_root: str) -> tuple[float | None, str]:
    if device.source_kind == HWMON_POWER:
        from .hwmon import power_w

        watts = power_w(device.source_argument, sysfs_root)
        return watts, "" if watts is not None else f"no power in {device.source_argument}"
    from .nvml import NvmlError

    nvml = handle.get()
    if nvml is None:
        return None, f"NVML at job end: {handle.why}"
    try:
        if device.source_kind == NVML_POWER:
            return nvml.power_w(device.source_argument), ""
        end = nvml.energy_mj(device.source_argument)
    except NvmlError as exc:
        return None, f"NVML at job end: {exc}"
    if end is None:
        return None, "the energy counter is no longer supported at job end"
    return float(end), ""


def device_figures(
    start: StartFile,
    library: str,
    poll: Mapping[str, PollState] | None = None,
    busy: Mapping[str, tuple[float, str, str]] | None = None,
    nvml=None,
    end_ns: int | None = None,
    boot: str | None = None,
    sysfs_root: str = SYSFS_ROOT,
    readings: Mapping[str, tuple[float | None, str]] | None = None,
    poll_s: float | None = None,
    poll_problem: str = "",
    deadline_s: float | None = None,
) -> list[DeviceEnergy]:
    """One :class:`DeviceEnergy` per device of the start file at the job's end.
    ``poll``: the sampler's integrals (None: no poll file; ``poll_problem``: why it could not be read);
    ``busy``: :func:`busy_times`; ``readings``: the devices' :func:`end_readings` (the Epilog takes them
    before it answers Slurm), else they are read now (``nvml``: an open NVML to use, else a guarded child);
    ``end_ns``/``boot``: the end's (default now's); ``sysfs_root``: where a hwmon power file must resolve
    (config ``sysfs_root``); ``poll_s``: the sampler's period (None: no gap check); ``deadline_s``: the
    reads' deadline (energy/guard.py)."""
    end_ns = clock_ns() if end_ns is None else end_ns
    boot = boot_id() if boot is None else boot
    if boot != start.boot or end_ns < start.start_ns:
        note = "the node rebooted during the job: its start readings are from another boot"
        return [DeviceEnergy(d.identity, d.kind, None, UNAVAILABLE, 0.0, note) for d in start.devices]
    if readings is None:
        readings = end_readings(start, library, sysfs_root, nvml, deadline_s)
    context = _End(start, (end_ns - start.start_ns) / 1e9, end_ns, readings, poll, poll_problem, poll_s)
    return [_figure(d, context, busy or {}) for d in start.devices]


def figures_so_far(
    state_fd: int,
    library: str,
    busy_of: Callable[[StartFile], Mapping[str, tuple[float, str, str]]],
    sysfs_root: str = SYSFS_ROOT,
    poll_s: float | None = None,
) -> list[tuple[StartFile, list[DeviceEnergy]]]:
    """Each running job's figures so far on this node: every start file in the state directory
    ``state_fd``, computed as the Epilog would with now as the job's end (``busy_of``: the
    :func:`busy_times` of a start file), without removing or changing any file. Each job's device reads
    are guarded as the Epilog's are (:func:`end_readings`); a file that cannot be read is passed over.
    ``poll_s``: the sampler's period (the gap rule)."""
    return [
        (start, device_figures(start, library, poll, busy_of(start), sysfs_root=sysfs_root, poll_s=poll_s))
        for start, poll in _running_starts(state_fd)
    ]


class _End:
    """What every device's figure of one job's end is computed from."""

    __slots__ = ("start", "seconds", "end_ns", "readings", "poll", "poll_problem", "poll_s")

    def __init__(self, start, seconds, end_ns, readings, poll, poll_problem, poll_s):
        self.start, self.seconds, self.end_ns, self.readings = start, seconds, end_ns, readings
        self.poll, self.poll_problem, self.poll_s = poll, poll_problem, poll_s


def _figure(device: StartDevice, end: _End, busy: Mapping[str, tuple[float, str, str]]) -> DeviceEnergy:
    kind, seconds = device.source_kind, end.seconds

    def unavailable(note: str) -> DeviceEnergy:
        return DeviceEnergy(device.identity, device.kind, None, UNAVAILABLE, seconds, note)

    def checked(joules: float, method: str, note: str = "") -> DeviceEnergy:
        # Never negative, never beyond what any device could draw over the job (a counter that jumped).
        if not 0 <= joules <= min(MAX_JOULES, MAX_DEVICE_W * max(seconds, 1.0)):
            return unavailable(f"implausible reading ({joules:.6g} J over {seconds:.3f} s): not counted")
        return DeviceEnergy(device.identity, device.kind, joules, method, seconds, note)

    reading, why = end.readings.get(device.identity, (None, "no reading at job end"))
    if kind == NVML_ENERGY:
        if device.start is None:
            return unavailable("no start reading of the energy counter")
        if reading is None:
            return unavailable(why)
        if reading < device.start:
            return unavailable(
                f"the energy counter went back ({device.start:.0f} -> {reading:.0f} mJ: a driver reload or GPU reset)"
            )
        return checked((reading - device.start) / 1000.0, MEASURED)
    if kind in (NVML_POWER, HWMON_POWER):
        state = (end.poll or {}).get(device.identity)
        if state is None or state.samples == 0:
            if end.poll is None:
                return unavailable(
                    f"the power samples could not be read: {end.poll_problem}" if end.poll_problem else NO_AGENT
                )
            return unavailable("no power sample was taken during the job")
        gap = _gap(state, end)
        if gap:
            return unavailable(gap)
        stretch_s = max(0.0, (end.end_ns - state.last_ns) / 1e9)
        last = state.last_watts if reading is None else (state.last_watts + reading) / 2
        return checked(state.joules + last * stretch_s, INTEGRATED)
    if kind == MODEL:
        model = _model(device.source_argument)
        if model is None:
            return unavailable(f"power model {device.source_argument[:40]!r} is not idle:active watts")
        idle_w, active_w = model
        share = 1.0 if device.shares is None else min(1.0, device.shares[0] / device.shares[1])
        busy_s, method, note = busy.get(device.identity, (0.0, ESTIMATED, "no busy time known: idle power only"))
        # Never past the allocation. Root's measurement (the broker's) is bounded by the job's seconds: the
        # broker ran its inferences one at a time on the device, whatever its share of the idle time; a
        # figure the job reported itself, by its part of them (a share: seconds x share).
        busy_s = min(busy_s, seconds if method == ESTIMATED else seconds * share)
        return checked(idle_w * seconds * share + (active_w - idle_w) * busy_s, method, note)
    if kind == NO_SOURCE:
        return unavailable(device.source_argument or "no power reading for this device")
    return unavailable(f"unknown energy source {device.source[:40]!r}")


def _gap(state: PollState, end: _End) -> str:
    """Why a polled figure is not counted: a stretch without a sample longer than :data:`GAP_PERIODS`
    sampler periods (before the first, between two, after the last); '' when there is none."""
    if end.poll_s is None or not end.poll_s > 0:
        return ""
    limit_ns = GAP_PERIODS * end.poll_s * 1e9
    stretches = (
        ("before the first sample", -1 if state.first_ns is None else state.first_ns - end.start.start_ns),
        ("between two samples", state.gap_ns),
        ("after the last sample", end.end_ns - state.last_ns),
    )
    for where, gap_ns in stretches:
        if gap_ns > limit_ns:
            return (
                f"no power sample for {gap_ns / 1e9:.0f} s {where} (the sampler polls every {end.poll_s:g} s):"
                " not counted"
            )
    return ""


def _model(argument: str) -> tuple[float, float] | None:
    """(idle W, active W) from a model source's ``idle:active``; None unless 0 <= idle <= active <= the bound."""
    idle, sep, active = argument.partition(":")
    try:
        watts = float(idle), float(active)
    except ValueError:
        return None
    return watts if sep and 0 <= watts[0] <= watts[1] <= MAX_DEVICE_W else None


def model_source(idle_w: float, active_w: float) -> str:
    """The ``model:<idle>:<active>`` source string (a family's declaration)."""
    return f"{MODEL}:{idle_w:g}:{active_w:g}"


# ---- the start and poll files in <state_dir>/energy (root's 0700; files 0600; no link followed)


def _energy_dir(state_fd: int, create: bool) -> int:
    from ..access import statedir

    return statedir.open_dir(DIR, create=create, parent_fd=state_fd, mode=0o700)


def write_start(state_fd: int, start: StartFile) -> None:
    """Write the job's start file (replacing one a requeued run of the job id left); StateDirError/OSError."""
    from ..access import statedir

    fd = _energy_dir(state_fd, create=True)
    try:
        # An earlier run's samples go first (a poll file the sampler still writes after this is of that
        # run's start: the sampler and the Epilog pass it over, see PollState.of_run).
        statedir.remove(fd, f"{start.job_id}{POLL_SUFFIX}")
        statedir.write_atomic(fd, str(start.job_id), encode(start), 0o600)
    finally:
        os.close(fd)


def _open_energy_dir(state_fd: int) -> tuple[int | None, str]:
    """The energy directory's fd, or None and why not ('' : no job ever had a start file here)."""
    from ..access import statedir

    try:
        os.lstat(DIR, dir_fd=state_fd)
        return _energy_dir(state_fd, create=False), ""
    except FileNotFoundError:
        return None, ""
    except (OSError, statedir.StateDirError) as exc:
        return None, str(exc)


def _read_job(fd: int, name: str) -> tuple[StartFile | None, dict[str, PollState] | None, str]:
    """Job ``name``'s start and poll files in the energy directory ``fd`` (None: not there, or not read),
    and why a file could not be read ('' : both fine)."""
    from ..access import statedir
    from ..protocol import FormatError

    start = poll = None
    try:
        raw = statedir.read_file(fd, name, MAX_BYTES, owner=0)
        start = None if raw is None else decode(raw, f"{DIR}/{name}")
        raw = statedir.read_file(fd, name + POLL_SUFFIX, MAX_BYTES, owner=0)
        poll = None if raw is None else decode_poll(raw, f"{DIR}/{name}{POLL_SUFFIX}")
    except (statedir.StateDirError, FormatError) as exc:
        return start, None, str(exc)
    return start, poll, ""


def _of_run(start: StartFile | None, poll: Mapping[str, PollState] | None) -> bool:
    """Whether a poll file is the start file's run's (or there is not both to compare)."""
    return start is None or poll is None or all(state.of_run(start) for state in poll.values())


def take_start(state_fd: int, job_id: int) -> tuple[StartFile | None, dict[str, PollState] | None, str]:
    """The job's start file and poll file (None: none there), and why a file could not be read ('' : both
    fine); both files are removed, whatever they held (root's own files, read once)."""
    from ..access import statedir

    fd, why = _open_energy_dir(state_fd)
    if fd is None:
        return None, None, why
    try:
        name = str(job_id)
        start, poll, why = _read_job(fd, name)
        if not _of_run(start, poll):
            poll, why = None, f"{DIR}/{name}{POLL_SUFFIX} is of an earlier run of job {name} (requeued): not counted"
        for leftover in (name, name + POLL_SUFFIX):
            statedir.remove(fd, leftover)
    finally:
        os.close(fd)
    return start, poll, why


def _running_starts(state_fd: int) -> list[tuple[StartFile, dict[str, PollState] | None]]:
    """(start file, poll file or None) of every job with a start file here now, in job order; nothing is
    changed, and a file that cannot be read is passed over (the Epilog says why at the job's end)."""
    fd, _ = _open_energy_dir(state_fd)
    if fd is None:
        return []
    found = []
    try:
        for name in sorted((n for n in os.listdir(fd) if n.isdigit()), key=int):
            start, poll, _ = _read_job(fd, name)
            if start is not None:  # a poll file not read, or of an earlier run, is None: those figures are unavailable
                found.append((start, poll if _of_run(start, poll) else None))
    finally:
        os.close(fd)
    return found


def discard_start(state_fd: int, job_id: int) -> None:
    """Remove the job's start and poll files unread (the Epilog with energy turned off since its Prolog)."""
    from ..access import statedir

    try:
        fd = _energy_dir(state_fd, create=False)
    except (OSError, statedir.StateDirError):
        return
    try:
        for leftover in (str(job_id), f"{job_id}{POLL_SUFFIX}"):
            statedir.remove(fd, leftover)
    finally:
        os.close(fd)
