"""The one module that touches a TFLite runtime or libedgetpu.

Runtimes, in order of preference: LiteRT (``ai_edge_litert``) then ``tflite_runtime``
(same Interpreter API; frozen at 2.14, needs numpy<2); ``SLURM_TPU_RUNTIME`` forces one.

Edge TPUs are opened through libedgetpu's C API by sysfs/device path
(``edgetpu_create_delegate``), not the external delegate ABI (``load_delegate(lib,
{"device": "usb:N"})``): its N is a position in libedgetpu's own enumeration, which
shifts whenever another USB stick loads its firmware, so "usb:0" can be another job's
TPU. The Interpreter (LiteRT and tflite-runtime alike) only needs, of each delegate
object, a ``_get_native_delegate_pointer()``, and keeps the objects alive until its
native interpreter is gone, as pycoral's ``make_interpreter`` relies on too: so
:class:`EdgeTpuDelegate` wraps the raw pointer, and pycoral is not needed.

GPUs go through LiteRT's CompiledModel API with ``HardwareAccelerator.GPU`` (WebGPU
over Vulkan), which raises when no adapter can be set up.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np

from .choices import LIBEDGETPU_DEFAULT, LIBEDGETPU_ENV, RUNTIME_ENV, RUNTIME_MODULES
from .errors import GpuError, LibEdgeTpuError, ModelError, RuntimeMissingError
from .modelinfo import TensorSpec

DEBUG_ENV = "SLURM_TPU_DEBUG"


def select_runtime(preferred: str | None = None) -> str:
    """The runtime to use: ``preferred``, else $SLURM_TPU_RUNTIME, else the first importable."""
    preferred = preferred or os.environ.get(RUNTIME_ENV) or None
    if preferred is not None and preferred not in RUNTIME_MODULES:
        raise RuntimeMissingError(
            f"unknown runtime '{preferred}' (from --runtime or {RUNTIME_ENV}): use one of {', '.join(RUNTIME_MODULES)}"
        )
    errors = []
    for name in [preferred] if preferred else list(RUNTIME_MODULES):
        try:
            importlib.import_module(RUNTIME_MODULES[name])
            return name
        except ImportError as exc:  # tflite-runtime under numpy 2 also lands here
            errors.append(f"{name}: {exc}".splitlines()[0])
    raise RuntimeMissingError(
        f"no TFLite runtime could be imported ({'; '.join(errors)}): pip install 'slurm-tpu[infer]' (ai-edge-litert)"
    )


def runtime_version(name: str) -> str:
    from importlib import metadata

    dist = {"litert": "ai-edge-litert", "tflite-runtime": "tflite-runtime"}[name]
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


@contextlib.contextmanager
def native_stderr_captured() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 meanwhile (LiteRT logs INFO lines there), which
    would break the CLI's one-line errors; replayed when $SLURM_TPU_DEBUG is set.
    Process-wide: call from one thread at a time (engines are opened sequentially)."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all: nothing to capture
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            lines.extend(line for line in text.splitlines() if line.strip())
            if os.environ.get(DEBUG_ENV) and text:
                os.write(2, text.encode())


def _spec_from_details(d: dict) -> TensorSpec:
    scale, zero = d.get("quantization", (0.0, 0))
    return TensorSpec(d["name"], tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]), float(scale), int(zero))


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


_TYPES = {"pci": 0, "usb": 1}  # enum edgetpu_device_type: EDGETPU_APEX_PCI, EDGETPU_APEX_USB
_TYPE_NAMES = {v: k for k, v in _TYPES.items()}


class EdgeTpuLibrary:
    """libedgetpu.so.1 (or a compatible library) loaded with ctypes."""

    def __init__(self, path: str | None = None):
        self.path = path or os.environ.get(LIBEDGETPU_ENV) or LIBEDGETPU_DEFAULT
        try:
            lib = ctypes.CDLL(self.path)
        except OSError as exc:
            reason = str(exc).split(": ")[-1]
            raise LibEdgeTpuError(
                f"cannot load the Edge TPU runtime {self.path} ({reason}): install libedgetpu1-std "
                f"from Coral's apt repository, or point --libedgetpu / {LIBEDGETPU_ENV} at it",
                self.path,
            ) from None
        try:
            lib.edgetpu_list_devices.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
            lib.edgetpu_list_devices.restype = ctypes.POINTER(_Device)
            lib.edgetpu_free_devices.argtypes = [ctypes.POINTER(_Device)]
            lib.edgetpu_free_devices.restype = None
            # (type, path, options, number of options): no options, libedgetpu's defaults
            lib.edgetpu_create_delegate.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
            lib.edgetpu_create_delegate.restype = ctypes.c_void_p
            lib.edgetpu_free_delegate.argtypes = [ctypes.c_void_p]
            lib.edgetpu_free_delegate.restype = None
        except AttributeError as exc:
            raise LibEdgeTpuError(
                f"{self.path} lacks libedgetpu's C API ({exc}): it is not libedgetpu.so.1, or a very old one", self.path
            ) from None
        # Both exist in every libedgetpu release; a library without them still runs models.
        self._version = getattr(lib, "edgetpu_version", None)
        if self._version is not None:
            self._version.argtypes, self._version.restype = [], ctypes.c_char_p
        self._verbosity = getattr(lib, "edgetpu_verbosity", None)
        if self._verbosity is not None:
            self._verbosity.argtypes, self._verbosity.restype = [ctypes.c_int], None
        self._lib = lib

    def version(self) -> str | None:
        """edgetpu_version(): "BuildLabel(COMPILER=...,DATE=...), RuntimeVersion(14)"."""
        if self._version is None:
            return None
        return (self._version() or b"").decode("utf-8", "replace") or None

    def list_devices(self) -> list[tuple[str, str]]:
        """(type, path) of every Edge TPU libedgetpu can see, in its own order."""
        count = ctypes.c_size_t(0)
        devices = self._lib.edgetpu_list_devices(ctypes.byref(count))
        try:
            return [
                (_TYPE_NAMES.get(devices[i].type, str(devices[i].type)), devices[i].path.decode())
                for i in range(count.value)
            ]
        finally:
            if devices:
                self._lib.edgetpu_free_devices(devices)

    def create_delegate(self, device_type: str, path: str, log: list[str] | None = None) -> EdgeTpuDelegate | None:
        """A delegate bound to the device at ``path``; None when libedgetpu cannot open it.

        With ``log``, libedgetpu's own messages during the attempt are appended to it:
        the library says why an open failed only on stderr and only with its verbosity
        raised, so both are done for this one call (see :func:`libedgetpu_reason`).
        """
        if log is None or self._verbosity is None:
            pointer = self._lib.edgetpu_create_delegate(_TYPES[device_type], path.encode(), None, 0)
        else:
            with native_stderr_captured() as lines:
                self._verbosity(1)
                try:
                    pointer = self._lib.edgetpu_create_delegate(_TYPES[device_type], path.encode(), None, 0)
                finally:
                    self._verbosity(0)  # quiet again before the model runs
            log.extend(lines)
        return EdgeTpuDelegate(self._lib.edgetpu_free_delegate, pointer) if pointer else None


def libedgetpu_reason(log: list[str], path: str) -> str | None:
    """libedgetpu's own reason for failing to open ``path``, from its verbose log.

    The line looks like ``I <file>:<line>] Failed to open device [Apex (USB)] at
    [/sys/bus/usb/devices/2-1.3]: Unknown: USB error -1 [GetDeviceDescriptor]``.
    """
    marker = f"at [{path}]: "
    for line in reversed(log):
        if "Failed to open device" in line and marker in line:
            return line.split(marker, 1)[1].strip()
    for line in reversed(log):  # another library's wording: its last complaint
        if "rror" in line or "ailed" in line:
            return line.split("] ", 1)[-1].strip()[:200]
    return None


class EdgeTpuDelegate:
    """A ``TfLiteDelegate*`` from edgetpu_create_delegate, shaped like the runtimes' Delegate.

    The interpreter stores this object in its ``_delegates`` and drops it after its
    native interpreter (see Interpreter.__del__), so freeing in ``close``/``__del__``
    never pulls the delegate from under a live interpreter.
    """

    def __init__(self, free: Callable[[int], None], pointer: int):
        self._free: Callable[[int], None] | None = free  # edgetpu_free_delegate
        self._pointer = pointer

    def _get_native_delegate_pointer(self) -> int:
        return self._pointer

    def close(self) -> None:
        if self._free is not None:
            self._free(self._pointer)
            self._free = None

    def __del__(self) -> None:
        self.close()


class InterpreterEngine:
    """A model in a TFLite Interpreter (CPU, or CPU + Edge TPU delegate)."""

    def __init__(
        self, model_path: str, label: str, runtime: str, num_threads: int, delegate: EdgeTpuDelegate | None = None
    ):
        self.label = label
        module = importlib.import_module(RUNTIME_MODULES[runtime])
        delegates = [delegate] if delegate is not None else None
        error: ValueError | RuntimeError | None = None
        with native_stderr_captured() as log:
            try:
                interpreter = module.Interpreter(
                    model_path=model_path, num_threads=num_threads, experimental_delegates=delegates
                )
                interpreter.allocate_tensors()
            except (ValueError, RuntimeError) as exc:
                error = exc
        if error is not None:
            if delegate is not None:
                delegate.close()
            raise ModelError(_interpreter_failure(model_path, str(error), log), model_path)
        self._interpreter: Any = interpreter  # None once closed
        self._delegate = delegate
        ins, outs = interpreter.get_input_details(), interpreter.get_output_details()
        self.inputs: Sequence[TensorSpec] = [_spec_from_details(d) for d in ins]
        self.outputs: Sequence[TensorSpec] = [_spec_from_details(d) for d in outs]
        self._in_index = [d["index"] for d in ins]
        self._out_index = [d["index"] for d in outs]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        interpreter = self._interpreter
        for index, value in zip(self._in_index, inputs):
            interpreter.set_tensor(index, value)
        interpreter.invoke()  # releases the GIL: other engines and decoders run meanwhile
        return [interpreter.get_tensor(index) for index in self._out_index]  # get_tensor copies

    def close(self) -> None:
        # Interpreter first, then the delegate it points into, then (by the caller) the lock.
        self._interpreter = None
        if self._delegate is not None:
            self._delegate.close()
            self._delegate = None


def _interpreter_failure(model_path: str, message: str, log: list[str]) -> str:
    text = " ".join([message] + log)
    if "edgetpu-custom-op" in text:
        return (
            f"model {model_path} needs the Edge TPU but the Edge TPU runtime did not take its "
            "edgetpu-custom-op: check that libedgetpu matches the compiler version"
        )
    first = next((line for line in [message] + log if "ERROR" in line or "rror" in line), message)
    return f"cannot load model {model_path}: {first.strip().splitlines()[0][:200]}"


class GpuEngine:
    """A model compiled for the GPU by LiteRT's CompiledModel (WebGPU over Vulkan)."""

    def __init__(
        self, model_path: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], accelerator: str = "gpu"
    ):
        # accelerator="cpu" runs the very same CompiledModel path on LiteRT's CPU
        # accelerator: how tests exercise this class on machines without a GPU.
        self.label = accelerator
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        except ImportError as exc:
            raise GpuError(
                f"GPU inference needs ai-edge-litert's CompiledModel ({exc}): pip install 'slurm-tpu[infer]'", "gpu"
            ) from None
        failed = False
        with native_stderr_captured() as log:
            try:
                accel = HardwareAccelerator.GPU if accelerator == "gpu" else HardwareAccelerator.CPU
                model = CompiledModel.from_file(model_path, hardware_accel=accel)
                in_buffers = model.create_input_buffers(0)
                out_buffers = model.create_output_buffers(0)
            except Exception:  # noqa: BLE001 - the wrapper raises RuntimeError with a multi-line trace
                failed = True
            if failed:  # out of the except block, whose traceback would keep it alive:
                # destroy the half-built LiteRT environment now, while its log goes to the
                # capture; otherwise its teardown prints INFO lines at interpreter exit.
                gc.collect()
        if failed:
            raise GpuError(
                "the GPU could not be set up by LiteRT's GPU accelerator (WebGPU over Vulkan: "
                f"{_gpu_reason(log)}): install libvulkan1 and the GPU's Vulkan driver, "
                "or pass --fallback cpu",
                "gpu",
            )
        self._model = model
        self._in, self._out = in_buffers, out_buffers
        self.inputs: Sequence[TensorSpec] = list(inputs)
        self.outputs: Sequence[TensorSpec] = list(outputs)
        self._sizes = [int(np.prod(o.shape)) for o in self.outputs]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        for buffer, value in zip(self._in, inputs):
            buffer.write(np.ascontiguousarray(value))
        self._model.run_by_index(0, self._in, self._out)
        return [
            buffer.read(size, spec.dtype).reshape(spec.shape)
            for buffer, size, spec in zip(self._out, self._sizes, self.outputs)
        ]

    def close(self) -> None:
        # LiteRT logs its environment's teardown on fd 2; keep it off the user's terminal.
        with native_stderr_captured():
            self._in = self._out = []
            if getattr(self, "_model", None) is not None:
                environment = self._model.environment
                self._model.close()
                self._model = None
                environment.close()  # the accelerators go with it, logging as they go
            gc.collect()


def _gpu_reason(log: list[str]) -> str:
    """The most telling line of LiteRT/Dawn's log about why no GPU was set up."""
    for needle in ("Couldn't load Vulkan", "No adapters", "Failed to initialize", "ERROR"):
        for line in log:
            if needle in line:
                reason = line.split("] ")[-1].strip().rstrip(".")
                return reason.removeprefix("Warning: ")[:160]
    return "no usable GPU adapter"
