"""``python -m slurm_tpu.broker``: the node's TPU broker (root; the unit slurm-tpu-broker.service).

Its devices are the node's shared Edge TPUs, read as the node agent reads its settings (the
hook snapshot: ``HookSettings.shards`` names them, the known devices give their nodes), or
given with ``--device IDENTITY=usb:PATH|pci:PATH`` (tests, the benchmark). With none, one line
and exit status 2. SIGTERM (or SIGINT) removes the control socket and the pid file and exits 0.
``--twin`` (or ``SLURM_TPU_BROKER_TWIN=1``): the test mode in which an Edge TPU executable
forwarded by a job's libedgetpu runs as its CPU twin (executor.py); never on a real node.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..errors import SlurmTpuError
from ..protocol.jobenv import libedgetpu_path
from .executor import SharedDevice
from .server import Broker, Limits

TWIN_ENV = "SLURM_TPU_BROKER_TWIN"


def parse_device(text: str) -> SharedDevice:
    """``IDENTITY=usb:PATH`` / ``IDENTITY=pci:PATH`` (``IDENTITY=cpu``: the CPU alone, for benchmarks)."""
    identity, sep, where = text.partition("=")
    if not sep or not identity:
        raise argparse.ArgumentTypeError(f"--device {text}: give IDENTITY=usb:PATH, IDENTITY=pci:PATH or IDENTITY=cpu")
    if where == "cpu":
        return SharedDevice(identity, None, None)
    kind, sep, path = where.partition(":")
    if not sep or kind not in ("usb", "pci") or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"--device {text}: give IDENTITY=usb:PATH or IDENTITY=pci:PATH")
    return SharedDevice(identity, kind, path)


def devices_from_settings(environ) -> tuple[str, list[SharedDevice]]:
    """(state_dir, shared devices) from the node's hook settings."""
    from ..hooks import settings as hook_settings
    from ..hooks.context import node_from_env

    settings = hook_settings.load(environ, node_from_env(environ), create=False)
    policy = settings.shards
    devices = []
    for identity in sorted(policy.devices if policy is not None else {}):
        known = settings.devices.get(identity)
        try:
            kind, path = libedgetpu_path(identity, known.primary_node if known else None)
        except ValueError as exc:
            logging.getLogger("slurm_tpu.broker").warning("broker: %s: left out", exc)
            continue
        devices.append(SharedDevice(identity, kind, path))
    return settings.state_dir, devices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_tpu.broker", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", help="the node's state directory (default: the node's settings)")
    parser.add_argument("--device", action="append", type=parse_device, default=[], help="IDENTITY=usb:PATH|pci:PATH")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per interpreter (default 1)")
    parser.add_argument("--runtime", help="litert or tflite-runtime (default: the first importable)")
    parser.add_argument("--libedgetpu", help="libedgetpu.so.1 to use (default: $SLURM_TPU_LIBEDGETPU or the system's)")
    parser.add_argument("--in-flight", type=int, default=Limits.in_flight, help="requests in flight per job")
    parser.add_argument(
        "--twin",
        action="store_true",
        default=os.environ.get(TWIN_ENV) == "1",
        help=f"tests only: run forwarded Edge TPU executables as their CPU twins (also {TWIN_ENV}=1)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        state_dir, devices = args.state_dir, list(args.device)
        if not devices or not state_dir:
            from_settings = devices_from_settings(os.environ)
            state_dir = state_dir or from_settings[0]
            devices = devices or from_settings[1]
        if not devices:
            print(
                "slurm-tpu broker: this node shares no Edge TPU (families.edgetpu.shared in config.yaml "
                "names none that is here): nothing to broker",
                file=sys.stderr,
            )
            return 2
        broker = Broker(
            state_dir,
            devices,
            runtime=args.runtime,
            threads=max(1, args.threads),
            libedgetpu=args.libedgetpu,
            limits=Limits(in_flight=max(1, args.in_flight)),
            twin=args.twin,
        )
        stopped = threading.Event()

        def on_signal(signum, frame) -> None:
            stopped.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        broker.start()
    except SlurmTpuError as exc:
        print(f"slurm-tpu broker: {exc}", file=sys.stderr)
        return 1
    names = ", ".join(d.identity for d in devices)
    if args.twin:
        logging.getLogger("slurm_tpu.broker").warning(
            "broker: twin mode (tests): forwarded Edge TPU executables run as their CPU twins"
        )
    logging.getLogger("slurm_tpu.broker").info("broker: serving %s on %s (pid %s)", names, state_dir, os.getpid())
    while not stopped.wait(3600):
        pass
    broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
