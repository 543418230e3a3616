"""A job's energy on its accelerators: how each figure was obtained, one device's figure, and the
start file that carries the job's first readings from its Prolog to its Epilog.

Every figure names its method (never a bare number):

- ``measured``: a device's own energy counter (NVML's total energy, mJ since the driver loaded),
  read at the job's start and end; the figure is the difference.
- ``integrated``: the device's polled power (NVML power on GPUs without the counter, AMD's hwmon
  ``power1_average``) integrated over the job by the node agent's sampler.
- ``estimated``: the power model, idle watts x allocated time + (active - idle) watts x busy time,
  with root's own busy time (the TPU broker's) or none (a device the job held but never reported on).
- ``self-reported``: the same model with the busy time the job's own code reported (the runner's
  usage record), bounded by the allocated time: a user can inflate only their own job's figure,
  and never past active watts x allocated time.
- ``unavailable``: no figure, and ``note`` says why (no sensor, a counter that went back, no start reading).

The start file ``<state_dir>/energy/<job>`` (root's 0600 in a root 0700 directory; written by the
Prolog, read and removed by the Epilog; key=value lines, no JSON: the hooks' import budget)::

    version=1
    job=<job id>
    uid=<the job's user>      # absent in files from before it was written: the metrics then leave the job out
    boot=<boot id>            # /proc/sys/kernel/random/boot_id: a reboot between the two ends the figure
    start_ns=<CLOCK_BOOTTIME ns>
    dev=<identity>\t<kind>\t<source>\t<start value, or empty>\t<shares held>/<device's shares, or empty>

one ``dev`` line per accelerator the job holds on the node (leased, or shared through the broker).
``source`` is one of :data:`SOURCES` followed by ``:`` and its argument (a GPU's PCI bus id, a
hwmon power file, the model's ``idle_w:active_w``, or why there is none).
"""

from __future__ import annotations

from . import FormatError, Record, decimal_text as _number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

DIR = "energy"  # under the state directory
FORMAT_VERSION = 1
MAX_BYTES = 16 * 1024
# The methods, in the order a node's methods are listed (``measured+estimated``).
MEASURED, INTEGRATED, ESTIMATED, SELF_REPORTED, UNAVAILABLE = (
    "measured",
    "integrated",
    "estimated",
    "self-reported",
    "unavailable",
)
METHODS = (MEASURED, INTEGRATED, ESTIMATED, SELF_REPORTED, UNAVAILABLE)
# Where a device's figure comes from (the start file's ``source`` field, before its ``:``).
NVML_ENERGY, NVML_POWER, HWMON_POWER, MODEL, NO_SOURCE = "nvml-energy", "nvml-power", "hwmon-power", "model", "none"
SOURCES = (NVML_ENERGY, NVML_POWER, HWMON_POWER, MODEL, NO_SOURCE)
METHOD_OF_SOURCE = {NVML_ENERGY: MEASURED, NVML_POWER: INTEGRATED, HWMON_POWER: INTEGRATED, MODEL: ESTIMATED}
# No device draws more; a figure beyond it (a forged or corrupt reading) is refused whole.
MAX_JOULES = 10.0**12
# No device draws more power (100 kW): a larger reading is a broken sensor, not a sample.
MAX_WATTS = 1.0e5


class DeviceEnergy(Record):
    """One device's energy for one job: ``joules`` (None when ``method`` is ``unavailable``), the
    ``method`` (:data:`METHODS`), the seconds the job held it, and a short ``note`` (why a figure is
    unavailable; where an estimate's busy time came from)."""

    __slots__ = ("identity", "kind", "joules", "method", "seconds", "note")

    def __init__(self, identity: str, kind: str, joules: float | None, method: str, seconds: float, note: str = ""):
        self.identity, self.kind, self.joules, self.method = identity, kind, joules, method
        self.seconds, self.note = seconds, note


class StartDevice(Record):
    """One device's line of a start file."""

    __slots__ = ("identity", "kind", "source", "start", "shares")

    def __init__(self, identity: str, kind: str, source: str, start: float | None, shares: tuple[int, int] | None):
        self.identity, self.kind, self.source, self.start, self.shares = identity, kind, source, start, shares

    @property
    def source_kind(self) -> str:
        """The source's name (:data:`SOURCES`), without its argument."""
        return self.source.partition(":")[0]

    @property
    def source_argument(self) -> str:
        return self.source.partition(":")[2]


class StartFile(Record):
    """A job's start readings on this node (``uid``: the job's user, -1 when unknown)."""

    __slots__ = ("job_id", "boot", "start_ns", "devices", "uid")

    def __init__(self, job_id: int, boot: str, start_ns: int, devices: list[StartDevice], uid: int = -1):
        self.job_id, self.boot, self.start_ns, self.devices, self.uid = job_id, boot, start_ns, devices, uid


def _field(value: str, source: str) -> str:
    if any(c in value for c in "\t\n"):
        raise ValueError(f"{source}: a field holds a tab or newline: {value[:60]!r}")
    return value


def encode(start: StartFile) -> bytes:
    """The start file's bytes."""
    lines = [f"version={FORMAT_VERSION}", f"job={start.job_id}"]
    if start.uid >= 0:
        lines.append(f"uid={start.uid}")
    lines.append(f"boot={_field(start.boot, 'boot')}")
    lines.append(f"start_ns={start.start_ns}")
    for device in start.devices:
        value = "" if device.start is None else _number(device.start)
        shares = "" if device.shares is None else f"{device.shares[0]}/{device.shares[1]}"
        fields = (device.identity, device.kind, device.source, value, shares)
        lines.append("dev=" + "\t".join(_field(f, device.identity) for f in fields))
    return ("\n".join(lines) + "\n").encode()


def decode(raw: bytes, source: str) -> StartFile:
    """The start file in ``raw``; :class:`FormatError` naming ``source`` and what is wrong."""
    if len(raw) > MAX_BYTES:
        raise FormatError(f"{source} is over {MAX_BYTES} bytes", source)
    fields: dict[str, str] = {}
    devices: list[StartDevice] = []
    try:
        for line in raw.decode("utf-8").splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"line {line[:40]!r} is not key=value")
            if key != "dev":
                fields[key] = value
                continue
            identity, kind, where, start, shares = value.split("\t")
            if where.partition(":")[0] not in SOURCES:
                raise ValueError(f"{identity}: unknown source {where[:40]!r}")
            reading = float(start) if start else None
            if reading is not None and not 0 <= reading <= 2.0**64:  # NaN fails too
                raise ValueError(f"{identity}: reading {start!r} out of range")
            held = None
            if shares:
                mine, _, total = shares.partition("/")
                held = (int(mine), int(total))
                if held[0] <= 0 or held[1] <= 0:
                    raise ValueError(f"{identity}: shares {shares!r}")
            devices.append(StartDevice(identity, kind, where, reading, held))
        if fields.get("version") != str(FORMAT_VERSION):
            raise ValueError(f"not format version {FORMAT_VERSION}")
        start_file = StartFile(
            int(fields["job"]), fields["boot"], int(fields["start_ns"]), devices, int(fields.get("uid", "-1"))
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{source} is not a slurm-tpu energy start file ({exc})", source) from None
    if start_file.job_id <= 0 or start_file.start_ns < 0 or start_file.uid < -1:
        raise FormatError(f"{source} names job {start_file.job_id} at {start_file.start_ns}", source)
    return start_file


def join_methods(methods: Iterable[str]) -> str:
    """The methods named in ``methods`` (each may itself be ``+``-joined, as a node's is), once each and
    in :data:`METHODS` order, joined by ``+`` (``measured+estimated``)."""
    present = {part for text in methods for part in text.split("+")}
    return "+".join(method for method in METHODS if method in present)


def node_method(figures: list[DeviceEnergy]) -> str:
    """The methods of a node's figures (:func:`join_methods`): the ``energy_method`` of its job record."""
    return join_methods(figure.method for figure in figures)


# The node agent's power sampler keeps, beside each start file with a polled source, the running
# integral of each such device: ``<state_dir>/energy/<job>.poll`` (root's 0600, replaced atomically
# at each poll)::
#
#     version=2
#     boot=<boot id>        # the run of the job id whose samples these are: its start file's boot and start_ns
#     start_ns=<CLOCK_BOOTTIME ns>
#     dev=<identity>\t<joules>\t<samples>\t<first_ns>\t<last_ns>\t<last_watts>\t<gap_ns>
#
# (CLOCK_BOOTTIME ns of the first and last sample, the longest stretch between two samples; trapezoids
# between samples). The Epilog adds the stretch from the last sample to the job's end at the last power
# read. A poll file whose boot or start_ns is not its start file's belongs to an earlier run of a requeued
# job id (the sampler wrote it as that run ended): it is not counted. Version 1 files (no header, no
# first sample or gap) are refused whole.
POLL_SUFFIX = ".poll"
POLL_VERSION = 2


class PollState(Record):
    """One device's running integral of polled power in one run of a job (``start_ns``/``boot``: that
    run's start file's; ``first_ns``: the first sample's time, None when unknown; ``gap_ns``: the longest
    stretch between two samples)."""

    __slots__ = ("identity", "joules", "samples", "last_ns", "last_watts", "first_ns", "gap_ns", "start_ns", "boot")

    def __init__(
        self,
        identity: str,
        joules: float,
        samples: int,
        last_ns: int,
        last_watts: float,
        first_ns: int | None = None,
        gap_ns: int = 0,
        start_ns: int = 0,
        boot: str = "",
    ):
        self.identity, self.joules, self.samples, self.last_ns, self.last_watts = (
            identity,
            joules,
            samples,
            last_ns,
            last_watts,
        )
        self.first_ns, self.gap_ns, self.start_ns, self.boot = first_ns, gap_ns, start_ns, boot

    def of_run(self, start: StartFile) -> bool:
        """Whether these samples are of the run that ``start`` began (not of an earlier run of its job id)."""
        return self.start_ns == start.start_ns and self.boot == start.boot


def encode_poll(states: list[PollState]) -> bytes:
    """A poll file's bytes (every state of one run: ValueError otherwise, or for none)."""
    if not states or any((s.start_ns, s.boot) != (states[0].start_ns, states[0].boot) for s in states):
        raise ValueError("a poll file holds the samples of one run of one job")
    lines = [f"version={POLL_VERSION}", f"boot={_field(states[0].boot, 'boot')}", f"start_ns={states[0].start_ns}"]
    for s in states:
        first = s.last_ns if s.first_ns is None else s.first_ns
        fields = (_number(s.joules), str(s.samples), str(first), str(s.last_ns), _number(s.last_watts), str(s.gap_ns))
        lines.append(f"dev={_field(s.identity, 'identity')}\t" + "\t".join(fields))
    return ("\n".join(lines) + "\n").encode()


def decode_poll(raw: bytes, source: str) -> dict[str, PollState]:
    """identity -> PollState from a poll file; :class:`FormatError` naming ``source`` for anything else
    (a version 1 file too: it cannot say which run it is of)."""
    if len(raw) > MAX_BYTES:
        raise FormatError(f"{source} is over {MAX_BYTES} bytes", source)
    fields: dict[str, str] = {}
    lines: list[str] = []
    found: dict[str, PollState] = {}
    try:
        text = raw.decode("utf-8")
        if text.partition("\n")[0] != f"version={POLL_VERSION}":  # a version 1 file has no header
            raise ValueError(f"not format version {POLL_VERSION}")
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"line {line[:40]!r} is not key=value")
            if key == "dev":
                lines.append(value)
            else:
                fields[key] = value
        if fields.get("version") != str(POLL_VERSION):
            raise ValueError(f"not format version {POLL_VERSION}")
        boot, start_ns = fields["boot"], int(fields["start_ns"])
        for value in lines:
            identity, joules, samples, first_ns, last_ns, watts, gap_ns = value.split("\t")
            state = PollState(
                identity,
                float(joules),
                int(samples),
                int(last_ns),
                float(watts),
                int(first_ns),
                int(gap_ns),
                start_ns,
                boot,
            )
            if not (0 <= state.joules <= MAX_JOULES and 0 <= state.last_watts <= MAX_WATTS) or state.samples < 0:
                raise ValueError(f"{identity}: figures out of range")
            if not int(first_ns) <= state.last_ns or state.gap_ns < 0:
                raise ValueError(f"{identity}: sample times out of order")
            found[identity] = state
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{source} is not a slurm-tpu power poll file ({exc})", source) from None
    return found
