"""``slurm-tpu watch``: follow udev events and keep Slurm's view of the node right.

Events come in bursts (a firmware load is a remove and an add; a flaky hub can send
dozens), so each relevant event restarts a settle timer, and only once the node has been
quiet for ``settle`` seconds is the hardware compared with the configured inventory: a
re-enumerated USB stick is back under its identity by then, and a real unplug/plug
triggers exactly one regeneration.
"""

from __future__ import annotations

import functools
import select
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from ..config import Config
from ..families import FAMILIES
from ..hardware import Inventory
from ..slurm.backend import SlurmBackend, open_backend
from .restart import RestartCommands, apply_hardware_change

WATCHED_SUBSYSTEMS = tuple(dict.fromkeys(s for f in FAMILIES for s in f.watched))


def relevant(subsystem: str, properties: dict[str, str]) -> bool:
    """Whether a udev event can change the node's accelerators (some family says so)."""
    return any(f.event_relevant(subsystem, properties) for f in FAMILIES)


@dataclass
class Watcher:
    """The watch loop's state and actions (I/O is injected for clarity and tests)."""

    config: Config
    node: str
    gres_conf: str
    node_conf: str | None
    commands: RestartCommands | None  # None: only rewrite the files
    settle: float = 5.0
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    @functools.cached_property
    def slurm(self) -> SlurmBackend:
        """The watcher's way to Slurm, opened once (a long-running process: pyslurm pays here)."""
        return open_backend(self.config, "watch")

    def sync(self, events: int) -> bool:
        """Detect, compare with the configured inventory, regenerate on a real change."""
        from ..detect import detect_inventory
        from ..render import node_gres
        from .configure import configure_node, prepare_node_state
        from .health_check import configured_inventory

        live: Inventory = detect_inventory(use_nvml=False)
        configured = configured_inventory(self.config)
        before = {a.identity for a in configured}
        after = {a.identity for a in live.usable()}
        if before == after:
            # Same devices; nodes may have moved (re-enumeration): refresh slots and state.
            prepare_node_state(self.config, live)
            self.log(
                f"slurm-tpu watch: {events} event(s), accelerators unchanged "
                f"({len(after)} configured); no configuration change"
            )
            return False
        added, removed = sorted(after - before), sorted(before - after)
        result = configure_node(self.config, live, self.node, self.gres_conf, self.node_conf)
        self.log(
            f"slurm-tpu watch: {events} event(s); added {added or 'none'}, removed {removed or 'none'}; "
            f"regenerated {self.gres_conf} (Gres={result.new_gres or 'none'})"
        )
        old_gres = node_gres(configured, self.config)
        if (
            result.changed
            and self.commands is not None
            and apply_hardware_change(
                self.slurm, self.node, old_gres != result.new_gres, self.commands, result.new_gres, self.log
            )
        ):
            self.log(f"slurm-tpu watch: {self.node} restarted with the new configuration and resumed")
        return True

    def run(self, stop_after: float | None = None) -> None:
        """Follow udev until interrupted (or for ``stop_after`` seconds)."""
        import pyudev

        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context)
        for subsystem in WATCHED_SUBSYSTEMS:
            monitor.filter_by(subsystem)
        monitor.start()
        started = time.monotonic()
        self.log(f"slurm-tpu watch: following udev for node {self.node} (settle {self.settle:g} s)")
        self.sync(0)  # bring things in line with hardware that changed while we were not running
        due, events = None, 0  # due: settle seconds after the last relevant event (None: none pending)
        while stop_after is None or time.monotonic() - started < stop_after:
            timeout = 1.0 if due is None else min(1.0, max(0.0, due - time.monotonic()))
            readable, _, _ = select.select([monitor], [], [], timeout)
            if readable:
                while (device := monitor.poll(timeout=0)) is not None:
                    if relevant(device.subsystem or "", dict(device.properties)):
                        due, events = time.monotonic() + self.settle, events + 1
            if due is not None and time.monotonic() >= due:
                self.sync(events)
                due, events = None, 0
