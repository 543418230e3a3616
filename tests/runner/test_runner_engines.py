"""The pipeline and the libedgetpu double, in-process, on real interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runner_support import PCI, USB_A, USB_B, double_log

from harness.modelgen import images
from slurm_tpu.runner import OpenOptions, Runner
from slurm_tpu.runner.engines import EdgeTpuLibrary, InterpreterEngine
from slurm_tpu.runner.errors import DeviceBusyError
from slurm_tpu.runner.lock import DeviceLock
from slurm_tpu.runner.pipeline import Item, infer_ordered


def _items(n: int) -> list[Item]:
    return [Item(i, f"k{i}", inputs=[images.bright_region_image(i % 9, 24, seed=i)[None]]) for i in range(n)]


def test_several_engines_keep_input_order(models):
    engines = [InterpreterEngine(str(models["classifier"]), f"cpu{i}", "litert", 1) for i in range(3)]
    try:
        out = list(infer_ordered(engines, _items(200)))
    finally:
        for e in engines:
            e.close()
    assert [item.seq for item in out] == list(range(200))
    assert [int(np.argmax(item.outputs[0])) for item in out] == [i % 9 for i in range(200)]


def test_chain_of_segments_matches_the_whole_model(models):
    whole = InterpreterEngine(str(models["classifier"]), "cpu", "litert", 1)
    chain = [InterpreterEngine(str(models[f"classifier_segment_{i}"]), "cpu", "litert", 1) for i in (0, 1)]
    expected = [whole.run(item.inputs)[0] for item in _items(50)]
    got = list(infer_ordered(chain, _items(50), chain=True))
    assert [item.seq for item in got] == list(range(50))
    for item, want in zip(got, expected):
        np.testing.assert_array_equal(item.outputs[0], want)


def test_error_items_pass_through_untouched(models):
    engines = [InterpreterEngine(str(models["classifier"]), "cpu", "litert", 1) for _ in range(2)]
    items = _items(3)
    items[1] = Item(1, "bad", error="input bad is broken")
    out = list(infer_ordered(engines, items))
    assert [i.error for i in out] == [None, "input bad is broken", None]


def test_double_lists_devices_in_the_order_it_is_given(libedgetpu_double, monkeypatch):
    monkeypatch.setenv("EDGETPU_DOUBLE_DEVICES", f"usb:{USB_B},pci:/dev/apex_0,usb:{USB_A}")
    lib = EdgeTpuLibrary(str(libedgetpu_double))
    assert lib.list_devices() == [("usb", USB_B), ("pci", "/dev/apex_0"), ("usb", USB_A)]
    assert lib.create_delegate("usb", "/sys/bus/usb/devices/9-9") is None


def test_why_not_usb_index_the_same_index_names_another_device(libedgetpu_double, tpu_env, monkeypatch):
    """The external-delegate ABI's "usb:N" follows libedgetpu's enumeration order."""
    from ai_edge_litert.interpreter import load_delegate

    for key, value in tpu_env.items():
        monkeypatch.setenv(key, value)
    opened = []
    for order in (f"usb:{USB_A},usb:{USB_B}", f"usb:{USB_B},usb:{USB_A}"):
        monkeypatch.setenv("EDGETPU_DOUBLE_DEVICES", order)
        delegate = load_delegate(str(libedgetpu_double), {"device": "usb:1"})
        del delegate
        opened.append([e["path"] for e in double_log(tpu_env) if e["call"] == "create"][-1])
    assert opened == [USB_B, USB_A]


def _open_nodes(root: str) -> list[str]:
    """What this process holds open under ``root``."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        if target.startswith(root):
            held.append(target)
    return held


def test_double_holds_the_device_node_open_until_the_delegate_is_freed(libedgetpu_double, tpu_env, monkeypatch):
    """As the real library: a USB stick's usbfs node (from its sysfs busnum/devnum), a card's own path."""
    for key, value in tpu_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EDGETPU_DOUBLE_DEVICES", f"usb:{USB_B},pci:{PCI}")
    root = tpu_env["EDGETPU_DOUBLE_ROOT"]
    lib = EdgeTpuLibrary(str(libedgetpu_double))
    stick, card = lib.create_delegate("usb", USB_B), lib.create_delegate("pci", PCI)
    assert stick is not None and card is not None
    assert sorted(_open_nodes(root)) == [f"{root}/dev/apex_0", f"{root}/dev/bus/usb/002/006"]
    stick.close()
    assert _open_nodes(root) == [f"{root}/dev/apex_0"]
    card.close()
    assert _open_nodes(root) == []
    assert [(e["call"], e["path"]) for e in double_log(tpu_env)] == [
        ("create", USB_B),
        ("create", PCI),
        ("free", USB_B),
        ("free", PCI),
    ]


def test_double_fails_like_the_real_library_when_the_node_cannot_be_opened(libedgetpu_double, tpu_env, tmp_path):
    """A listed device whose node is gone: NULL, one stderr line, an open-failed log line; and
    the external-delegate ABI's default device (the first PCIe one) is not replaced by another."""
    root = Path(tpu_env["EDGETPU_DOUBLE_ROOT"])
    (root / "dev" / "bus" / "usb" / "002" / "006").unlink()
    (root / "dev" / "apex_0").unlink()
    code = (
        "import ctypes, sys\n"
        "from ai_edge_litert.interpreter import load_delegate\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "lib.edgetpu_create_delegate.restype = ctypes.c_void_p\n"
        f"print(bool(lib.edgetpu_create_delegate(1, {USB_B!r}.encode(), None, 0)), flush=True)\n"
        "try:\n"
        "    load_delegate(sys.argv[1], {})\n"
        "except ValueError:\n"
        "    print('ValueError', flush=True)\n"
    )
    env = dict(tpu_env, EDGETPU_DOUBLE_DEVICES=f"usb:{USB_A},usb:{USB_B},pci:{PCI}")
    done = subprocess.run(
        [sys.executable, "-c", code, str(libedgetpu_double)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["False", "ValueError"], done.stderr
    failures = [line for line in done.stderr.splitlines() if "edgetpu_double.c]" in line]
    assert failures == [
        f"E edgetpu_double.c] Failed to open device [Apex (USB)] at [{USB_B}]: Unavailable: USB error -4 "
        f"[OpenDevice] ({root}/dev/bus/usb/002/006: No such file or directory)",
        f"E edgetpu_double.c] Failed to open device [Apex (PCIe)] at [{PCI}]: Failed precondition: Device open "
        f"failed : -1 (No such file or directory) ({root}/dev/apex_0: No such file or directory)",
    ]
    log = double_log(env)
    assert [(e["call"], e["type"], e["path"], e["errno"], e["node"]) for e in log] == [
        ("open-failed", "usb", USB_B, "ENOENT", f"{root}/dev/bus/usb/002/006"),
        ("open-failed", "pci", PCI, "ENOENT", f"{root}/dev/apex_0"),
    ]


def test_runner_api_on_the_double_releases_device_and_lock(models, tpu_env, monkeypatch):
    for key, value in tpu_env.items():  # the double reads its list from the real environment
        monkeypatch.setenv(key, value)
    with Runner(
        str(models["classifier"]),
        environ=tpu_env,
        warn=lambda m: None,
        options=OpenOptions(libedgetpu=tpu_env["SLURM_TPU_LIBEDGETPU"]),
    ) as runner:
        assert runner.on_edgetpu and runner.device_labels == ["edgetpu usb-2-1.4"]
        with pytest.raises(DeviceBusyError, match="in use by pid"):
            DeviceLock("usb-2-1.4", tpu_env)
        assert runner.classify(images.bright_region_image(8, 24)[None])[0].index == 8
    assert [e["call"] for e in double_log(tpu_env)] == ["create", "free"]
    DeviceLock("usb-2-1.4", tpu_env).release()  # free again once the runner closed


def test_tflite_runtime_backend_when_that_is_what_is_installed(models, tpu_env):
    """tflite-runtime (numpy<2) in its own venv, as bench_runner_runtimes.py creates it."""
    import subprocess
    from pathlib import Path

    python = Path("/tmp/venv-tflite-runtime/bin/python")
    if not python.exists():
        pytest.skip("no tflite-runtime venv (run bench/bench_runner_runtimes.py to create it)")
    repo = Path(__file__).resolve().parents[2]
    code = (
        "from slurm_tpu.runner import Runner\n"
        f"r = Runner({str(models['classifier'])!r}, warn=lambda m: None)\n"
        f"image = {str(models['images'] / 'img_00007.png')!r}\n"
        "print(r.engine_set.runtime, r.device_labels[0], r.classify(image)[0].index)"
    )
    env = dict(tpu_env, PYTHONPATH=str(repo))
    env.pop("SLURM_TPU_RUNTIME", None)
    out = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # No LiteRT in that venv: the runner picked tflite-runtime, and the by-path delegate worked there too.
    assert out.stdout.split() == ["tflite-runtime", "edgetpu", "usb-2-1.4", "7"]
    assert [e["call"] for e in double_log(tpu_env)] == ["create", "free"]


def test_compiled_model_engine_matches_the_interpreter(models):
    """GpuEngine's CompiledModel path (buffers in, run, buffers out) on LiteRT's CPU accelerator."""
    from slurm_tpu.runner.engines import GpuEngine
    from slurm_tpu.runner.modelinfo import read_model_info

    info = read_model_info(models["mobilenet"])
    compiled = GpuEngine(str(models["mobilenet"]), info.inputs, info.outputs, accelerator="cpu")
    interpreter = InterpreterEngine(str(models["mobilenet"]), "cpu", "litert", 1)
    try:
        for seed in range(3):
            image = np.random.default_rng(seed).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
            got, want = compiled.run([image])[0], interpreter.run([image])[0]
            assert got.shape == want.shape == (1, 1001) and got.dtype == np.uint8
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    finally:
        compiled.close()
        interpreter.close()


def test_lock_dir_skips_a_runtime_dir_that_cannot_be_made(tmp_path, monkeypatch):
    from slurm_tpu.runner.lock import lock_dir

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where a directory should go: mkdir fails
    env = {"XDG_RUNTIME_DIR": str(blocker / "run")}
    assert lock_dir(env) == lock_dir({})  # fell back to /tmp/slurm-tpu-<uid>
    assert lock_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "slurm-tpu"
