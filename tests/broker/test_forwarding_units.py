"""The pieces of the shard forwarding that need no root, no broker and no libedgetpu: the one-op
model the broker builds (parsed by the real TFLite; it cannot run without silicon), the checks on an
executable ``load``'s tensor specs (hostile input), the job's EDGETPU_VISIBLE_DEVICES for a shard,
and the runner's reading of it."""

from __future__ import annotations

import numpy as np
import pytest

from harness.modelgen import classifier, detector, twin
from slurm_tpu.broker import oneop
from slurm_tpu.config import Config
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol import FormatError, envfile
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.protocol.leases import Lease
from slurm_tpu.runner.devices import BROKER, EDGETPU, resolve_devices
from slurm_tpu.runner.modelinfo import TensorSpec


def specs_of(details) -> list[TensorSpec]:
    return [
        TensorSpec(d["name"], tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]), *d["quantization"])
        for d in details
    ]


@pytest.mark.parametrize(
    "build", [classifier.build_classifier, detector.build_detector], ids=["classifier", "detector"]
)
def test_the_one_op_model_parses_in_tflite_with_the_declared_tensors(build):
    from ai_edge_litert.interpreter import Interpreter

    cpu = Interpreter(model_content=build())
    inputs, outputs = specs_of(cpu.get_input_details()), specs_of(cpu.get_output_details())
    executable = bytes(range(256)) * 40
    model = oneop.build(executable, inputs, outputs)
    built = Interpreter(model_content=model)
    for got, want in (
        (built.get_input_details(), cpu.get_input_details()),
        (built.get_output_details(), cpu.get_output_details()),
    ):
        assert [(d["name"], list(d["shape"]), d["dtype"], d["quantization"]) for d in got] == [
            (d["name"], list(d["shape"]), d["dtype"], d["quantization"]) for d in want
        ]
    assert oneop.same_tensors(inputs, specs_of(built.get_input_details()))
    # Its one op carries the executable byte for byte, under the name libedgetpu claims.
    assert twin.custom_options(model) == executable
    # Nothing here can run it: only a real Edge TPU's libedgetpu resolves the op.
    with pytest.raises(RuntimeError, match="unresolved custom op: edgetpu-custom-op"):
        built.allocate_tensors()


def spec(**changes) -> dict:
    base = {"name": "image", "shape": [1, 24, 24, 3], "dtype": "uint8", "quantization": [0.0039, 0]}
    return {**base, **changes}


def test_declared_tensors_are_read_and_bounded():
    inputs, outputs = oneop.declared_tensors({"inputs": [spec()], "outputs": [spec(name="scores", shape=[1, 9])]})
    assert inputs == [TensorSpec("image", (1, 24, 24, 3), np.dtype("uint8"), 0.0039, 0)]
    assert outputs[0].shape == (1, 9)
    refused = [
        {"inputs": [spec()]},  # no outputs
        {"inputs": [], "outputs": [spec()]},
        {"inputs": [spec()] * 65, "outputs": [spec()]},
        {"inputs": [spec(dtype="object")], "outputs": [spec()]},
        {"inputs": [spec(shape=[1, 0])], "outputs": [spec()]},
        {"inputs": [spec(shape=[1, -3])], "outputs": [spec()]},
        {"inputs": [spec(shape=[True, 2])], "outputs": [spec()]},
        {"inputs": [spec(shape=[1] * 17)], "outputs": [spec()]},
        {"inputs": [spec(shape=[1 << 20, 1 << 10])], "outputs": [spec()]},  # 1 GiB: more than one request
        {"inputs": [spec(quantization=[0.5])], "outputs": [spec()]},
        {"inputs": [spec(quantization=[0.5, 1.5])], "outputs": [spec()]},
        {"inputs": [spec(name="x" * 300)], "outputs": [spec()]},
        {"inputs": ["image"], "outputs": [spec()]},
    ]
    for header in refused:
        with pytest.raises(FormatError):
            oneop.declared_tensors(header)


def settings_with(devices: list[KnownDevice]) -> HookSettings:
    settings = HookSettings("/run/x")
    settings.devices = {d.identity: d for d in devices}
    apply_families(settings, Config())
    return settings


def visible_line(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("export EDGETPU_VISIBLE_DEVICES=")]
    return line.split("=", 1)[1]


def test_a_shard_jobs_visible_devices_name_the_broker_after_its_whole_tpus():
    endpoint = "/run/x/broker/jobs/7.sock"
    stick = KnownDevice("usb-2-1.3", "edgetpu", "usb", ("/dev/bus/usb/002/005",))
    card = KnownDevice("pci-0000:03:00.0", "edgetpu", "pci", ("/dev/apex_0",))
    settings = settings_with([stick, card])
    assert visible_line(envfile.render([], settings, broker=(endpoint, 2))) == f"broker:{endpoint}"
    leases = [Lease(identity=d.identity, job_id=7, uid=1000, kind=d.kind) for d in (card, stick)]
    assert (
        visible_line(envfile.render(leases, settings, broker=(endpoint, 1)))
        == f"/dev/apex_0,/sys/bus/usb/devices/2-1.3,broker:{endpoint}"
    )
    # Without shares nothing changes.
    assert visible_line(envfile.render(leases, settings)) == "/dev/apex_0,/sys/bus/usb/devices/2-1.3"
    with pytest.raises(ValueError):
        envfile.render([], settings, broker=("/run/x,y.sock", 1))


def test_the_runner_reads_a_shard_job_as_a_broker_device_whatever_the_visible_list_says():
    endpoint = "/run/x/broker/jobs/7.sock"
    environ = {"SLURM_TPU_BROKER": endpoint, "EDGETPU_VISIBLE_DEVICES": f"broker:{endpoint}"}
    [device] = resolve_devices(None, environ)
    assert (device.kind, device.path) == (BROKER, endpoint)
    both = dict(
        environ,
        SLURM_TPU_DEVICES="usb-2-1.3",
        SLURM_TPU_EDGETPU_PATHS="usb:/sys/bus/usb/devices/2-1.3",
        EDGETPU_VISIBLE_DEVICES=f"/sys/bus/usb/devices/2-1.3,broker:{endpoint}",
    )
    assert [d.kind for d in resolve_devices(None, both)] == [BROKER]
    assert [d.kind for d in resolve_devices(["usb-2-1.3"], both)] == [EDGETPU]
