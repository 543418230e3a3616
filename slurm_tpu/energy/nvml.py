"""NVIDIA's NVML through ctypes: a GPU's total energy counter and its power draw, by PCI bus id.

One :class:`Nvml` is one loaded and initialised library (``nvmlInit_v2`` ... ``nvmlShutdown``).
NVML counts its initialisations, so several in one process (a Prolog's and the agent sampler's)
do not disturb each other. A GPU that cannot give a reading (no counter before Volta, no power
on a Jetson: NVML_ERROR_NOT_SUPPORTED) reads as None; every other NVML failure, and a library
that cannot be loaded, is an :class:`NvmlError` with one line naming the library or the GPU and
NVML's own reason (``nvmlErrorString``). Nothing is loaded at import time: ctypes is imported
by the constructor, so a hook that never reads a GPU never pays for it.
"""

from __future__ import annotations

from ..defaults import NVML_LIBRARY
from ..errors import SlurmTpuError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# nvmlReturn_t values (NVIDIA's public nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
# The most a reading is shown with in a message: a bus id comes from the node's configuration.
_SHOWN = 80


class NvmlError(SlurmTpuError):
    """NVML cannot be loaded or initialised, or failed for one GPU. ``key``: the library or the GPU's
    bus id the message names; ``code``: NVML's return code (None when the library could not be loaded)."""

    def __init__(self, message: str, key: str, code: int | None = None):
        super().__init__(message)
        self.key, self.code = key, code


def _shown(text: str) -> str:
    """``text`` on one line and bounded, for a message."""
    flat = "".join(c if c.isprintable() else "?" for c in text)
    return flat if len(flat) <= _SHOWN else flat[:_SHOWN] + "..."


class Nvml:
    """One loaded and initialised NVML. Not shared between threads: each user opens its own (NVML's
    own initialisation is reference-counted). :meth:`close` (or ``with``) shuts it down."""

    def __init__(self, library: str = NVML_LIBRARY):
        """Load ``library`` (a path or a soname, found as the dynamic loader finds it) and call
        ``nvmlInit_v2``; :class:`NvmlError` naming the library when either fails."""
        import ctypes

        self.library = library
        self._ctypes: Any = ctypes
        self._lib: Any = None
        try:
            lib = ctypes.CDLL(library)
            self._error_string = lib.nvmlErrorString
            self._error_string.restype, self._error_string.argtypes = ctypes.c_char_p, [ctypes.c_int]
            for name, argtypes in (
                ("nvmlInit_v2", []),
                ("nvmlShutdown", []),
                ("nvmlDeviceGetHandleByPciBusId_v2", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
                ("nvmlDeviceGetTotalEnergyConsumption", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]),
                ("nvmlDeviceGetPowerUsage", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]),
            ):
                function = getattr(lib, name)
                function.restype, function.argtypes = ctypes.c_int, argtypes
        except OSError as exc:
            raise NvmlError(f"cannot load NVML ({_shown(library)}): {_shown(str(exc))}", library) from None
        except AttributeError as exc:  # a library that is not NVML, or one too old
            raise NvmlError(f"{_shown(library)} is not a usable NVML: {_shown(str(exc))}", library) from None
        code = lib.nvmlInit_v2()
        if code != NVML_SUCCESS:
            raise NvmlError(f"NVML ({_shown(library)}) did not start: {self._reason(code)}", library, code)
        self._lib = lib

    def _reason(self, code: int) -> str:
        """NVML's words for ``code``, with the code."""
        try:
            text = self._error_string(code)
        except Exception:  # noqa: BLE001 - only the words are lost, the code is still shown
            text = None
        words = text.decode("utf-8", "replace") if text else "unknown error"
        return f"{_shown(words)} (NVML error {code})"

    def _call(self, bus_id: str, function: str, out: Any) -> bool:
        """Call ``function(handle of bus_id, &out)``; True with ``out`` filled, False for NOT_SUPPORTED;
        :class:`NvmlError` naming the GPU for anything else."""
        if self._lib is None:
            raise NvmlError(f"NVML ({_shown(self.library)}) is closed: GPU {_shown(bus_id)} not read", bus_id)
        ctypes = self._ctypes
        handle = ctypes.c_void_p()
        try:
            encoded = bus_id.encode("ascii")
        except UnicodeEncodeError:
            encoded = b""
        code = NVML_ERROR_INVALID_ARGUMENT
        if encoded and b"\0" not in encoded:
            code = self._lib.nvmlDeviceGetHandleByPciBusId_v2(encoded, ctypes.byref(handle))
        if code == NVML_SUCCESS:
            code = getattr(self._lib, function)(handle, ctypes.byref(out))
            if code == NVML_ERROR_NOT_SUPPORTED:
                return False
        if code != NVML_SUCCESS:
            raise NvmlError(f"NVML: GPU {_shown(bus_id)}: {function}: {self._reason(code)}", bus_id, code)
        return True

    def energy_mj(self, bus_id: str) -> int | None:
        """GPU ``bus_id``'s total energy since its driver loaded, in mJ (nvmlDeviceGetTotalEnergyConsumption,
        Volta and newer); None where the GPU has no counter."""
        out = self._ctypes.c_ulonglong()
        return int(out.value) if self._call(bus_id, "nvmlDeviceGetTotalEnergyConsumption", out) else None

    def power_w(self, bus_id: str) -> float | None:
        """GPU ``bus_id``'s power draw now, in W (nvmlDeviceGetPowerUsage, mW); None where it has no reading."""
        out = self._ctypes.c_uint()
        return out.value / 1000.0 if self._call(bus_id, "nvmlDeviceGetPowerUsage", out) else None

    def close(self) -> None:
        """``nvmlShutdown`` (once; a closed Nvml reads nothing more). Its failure is not raised: there
        is nothing left to do about it."""
        lib, self._lib = self._lib, None
        if lib is not None:
            lib.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
