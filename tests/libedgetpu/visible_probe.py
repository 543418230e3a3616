"""Run inside a umockdev testbed: one thing unmodified Coral code does with the real libedgetpu.

``python visible_probe.py LIBEDGETPU ACTION`` prints one JSON object ``{"ok": ..., "listed":
[...], "seconds": ...}``. ACTION is what a user's script does:

  list          edgetpu_list_devices() (pycoral's list_edge_tpus()): "ok" is true, "listed"
                the "type:path" entries in the library's order;
  default       load_delegate(LIBEDGETPU) with no options (pycoral's make_interpreter(model),
                tflite's load_delegate('libedgetpu.so.1')): the default device;
  device=SPEC   load_delegate(LIBEDGETPU, {"device": SPEC}) (":0", "usb:1", "pci:0" ...);
  path=T:PATH   edgetpu_create_delegate(T, PATH) (an explicit device path, T usb or pci).

"ok" is whether a delegate came back. On this testbed none ever does (a fake device maps no
BAR and answers no USB request): which device nodes the library tried to open is what the
test reads, from strace around this script.
"""

import ctypes
import json
import sys
import time

TYPES = {"pci": 0, "usb": 1}  # enum edgetpu_device_type (edgetpu_c.h)


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


def listed(library: ctypes.CDLL) -> list[str]:
    count = ctypes.c_size_t()
    library.edgetpu_list_devices.restype = ctypes.POINTER(_Device)
    devices = library.edgetpu_list_devices(ctypes.byref(count))
    names = {value: name for name, value in TYPES.items()}
    entries = [f"{names.get(devices[i].type, devices[i].type)}:{devices[i].path.decode()}" for i in range(count.value)]
    if devices:
        library.edgetpu_free_devices(devices)
    return entries


def main() -> None:
    path, action = sys.argv[1], sys.argv[2]
    library = ctypes.CDLL(path)
    delegate_action = action != "list" and not action.startswith("path=")
    if delegate_action:
        # Imported before the clock starts: "seconds" is the library's time, not LiteRT's and
        # numpy's import, which takes 1 to 4 s under strace -f and says nothing about retries.
        from ai_edge_litert.interpreter import load_delegate
    started = time.perf_counter()
    entries: list[str] = []
    if action == "list":
        entries, ok = listed(library), True
    elif action.startswith("path="):
        kind, _, device = action.removeprefix("path=").partition(":")
        library.edgetpu_create_delegate.restype = ctypes.c_void_p
        ok = bool(library.edgetpu_create_delegate(TYPES[kind], device.encode(), None, 0))
    else:
        options = {} if action == "default" else {"device": action.removeprefix("device=")}
        try:
            load_delegate(path, options)
            ok = True
        except ValueError:  # "Failed to load delegate from ..."
            ok = False
    print(json.dumps({"ok": ok, "listed": entries, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
