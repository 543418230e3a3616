"""Unmodified Coral-style code on a TPU shard, run by the forwarding tests as a job's process.

    coral_probe.py LIBEDGETPU OP_MODEL CPU_MODEL N [--pause]

What Coral's documentation writes, and nothing slurm-tpu: ``load_delegate(LIBEDGETPU)`` with no
options (pycoral's ``make_interpreter(model)``), an ``Interpreter`` of OP_MODEL (compiled: an
``edgetpu-custom-op``) with that delegate, N invokes on seeded random inputs. Each answer is
compared with CPU_MODEL run in this process without any delegate. ``--pause``: after the first
invoke print ``{"ready": true}`` and wait for a line on stdin (the test stops or restarts the
broker meanwhile). Prints one JSON line: ``listed`` (edgetpu_list_devices), ``runs``, ``equal``,
and where it stopped, ``stage`` (load_delegate, interpreter, invoke) with the ``error`` as raised.
"""

import ctypes
import json
import sys

import numpy as np

try:
    import tflite_runtime.interpreter as tflite
except ImportError:
    import ai_edge_litert.interpreter as tflite


class Device(ctypes.Structure):  # struct edgetpu_device (edgetpu_c.h)
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


def listed(library: str) -> list:
    runtime = ctypes.CDLL(library)
    runtime.edgetpu_list_devices.restype = ctypes.POINTER(Device)
    count = ctypes.c_size_t()
    devices = runtime.edgetpu_list_devices(ctypes.byref(count))
    return [("pci" if devices[i].type == 0 else "usb") + ":" + devices[i].path.decode() for i in range(count.value)]


def run(interpreter, inputs) -> list:
    for detail, value in zip(interpreter.get_input_details(), inputs):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def main() -> dict:
    library, model, cpu_model, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    pause = "--pause" in sys.argv
    result: dict = {"listed": listed(library), "runs": 0}
    try:
        delegate = tflite.load_delegate(library)
    except ValueError as exc:
        return dict(result, stage="load_delegate", error=str(exc))
    try:
        interpreter = tflite.Interpreter(model_path=model, experimental_delegates=[delegate])
        interpreter.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        return dict(result, stage="interpreter", error=str(exc))
    reference = tflite.Interpreter(model_path=cpu_model)
    reference.allocate_tensors()
    rng = np.random.default_rng(5)
    equal = True
    for index in range(count):
        if pause and index == 1:
            print(json.dumps({"ready": True}), flush=True)
            sys.stdin.readline()
        inputs = [rng.integers(0, 256, d["shape"]).astype(d["dtype"]) for d in interpreter.get_input_details()]
        try:
            outputs = run(interpreter, inputs)
        except RuntimeError as exc:
            return dict(result, stage="invoke", error=str(exc), equal=equal)
        expected = run(reference, inputs)
        equal = equal and len(outputs) == len(expected)
        equal = equal and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(outputs, expected))
        result["runs"] += 1
    return dict(result, equal=equal)


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
