"""Run inside a Pyxis container (python3 of the image): what unmodified Coral code gets there.

``python3 pyxis_probe.py`` prints one JSON object: the job's variables as the container sees them,
``listed`` (edgetpu_list_devices(), pycoral's list_edge_tpus()), ``default_ok`` (LiteRT's
``load_delegate('libedgetpu.so.1')`` with no device, what ``make_interpreter(model)`` does), which
libedgetpu file the loader mapped, the device nodes under /dev the container sees (with their
major and minor numbers: each node of a local cluster has its own), the node and the uid.
"""

import ctypes
import json
import os


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


def listed(library: ctypes.CDLL) -> list:
    count = ctypes.c_size_t()
    library.edgetpu_list_devices.restype = ctypes.POINTER(_Device)
    devices = library.edgetpu_list_devices(ctypes.byref(count))
    names = {0: "pci", 1: "usb"}
    return [f"{names.get(devices[i].type)}:{devices[i].path.decode()}" for i in range(count.value)]


def nodes() -> list:
    found = []
    for top, _, files in os.walk("/dev"):
        found += [os.path.join(top, name) for name in files if name.startswith("apex_") or "/bus/usb/" in top]
    return sorted(found)


def main() -> None:
    result = {name: os.environ.get(name) for name in ("EDGETPU_VISIBLE_DEVICES", "SLURM_TPU_DEVICES")}
    found = nodes()
    result.update(uid=os.getuid(), nodes=found, library=None, listed=None, default_ok=None)
    result["node"] = os.environ.get("SLURMD_NODENAME")
    result["rdev"] = {path: [os.major(os.stat(path).st_rdev), os.minor(os.stat(path).st_rdev)] for path in found}
    try:
        library = ctypes.CDLL("libedgetpu.so.1")
    except OSError as exc:
        result["error"] = str(exc)
    else:
        result["listed"] = listed(library)
        with open("/proc/self/maps", encoding="utf-8") as handle:
            result["library"] = next((line.split()[-1] for line in handle if "libedgetpu" in line), None)
        from ai_edge_litert.interpreter import load_delegate

        try:
            load_delegate("libedgetpu.so.1")
            result["default_ok"] = True
        except ValueError:
            result["default_ok"] = False
    print(json.dumps(result))


if __name__ == "__main__":
    main()
