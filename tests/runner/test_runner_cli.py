"""`slurm-tpu infer` as a job runs it: output format, device selection, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from runner_support import USB_A, USB_B, double_log, run_cli


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"stderr should be one line, got:\n{result.stderr}"
    assert lines[0].startswith("slurm-tpu: error: ")
    return lines[0]


def test_single_image_prints_like_classify_image(models, clean_env):
    image = models["images"] / "img_00005.png"  # region 5: "right"
    r = run_cli(
        ["infer", models["classifier"], image, "--labels", models["classifier_labels"], "-k", "2", "-c", "3"], clean_env
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "----INFERENCE TIME----"
    assert [line.endswith("ms") for line in lines[1:4]] == [True] * 3
    assert lines[4] == "-------RESULTS--------"
    assert lines[5] == "right: 0.99609"
    assert len(lines) == 7  # top-2
    assert r.stderr == ""  # the runtime's INFO chatter is kept off the terminal


def test_single_image_json(models, clean_env):
    r = run_cli(
        [
            "infer",
            models["classifier"],
            models["images"] / "img_00003.png",
            "--json",
            "-c",
            "2",
            "--labels",
            models["classifier_labels"],
        ],
        clean_env,
    )
    data = json.loads(r.stdout)
    assert data["devices"] == ["cpu"] and data["runtime"] == "litert"
    assert len(data["times_ms"]) == 1 and data["first_ms"] >= 0
    assert data["classes"][0]["label"] == "left"


def test_threshold_filters_classes(models, clean_env):
    r = run_cli(
        ["infer", models["classifier"], models["images"] / "img_00003.png", "--json", "-k", "9", "-t", "0.5"], clean_env
    )
    assert [c["index"] for c in json.loads(r.stdout)["classes"]] == [3]


def test_benchmark_json(models, clean_env):
    r = run_cli(["infer", models["classifier"], "--benchmark", "--iterations", "20", "--json"], clean_env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["iterations"] == 20
    assert 0 <= data["p50_ms"] <= data["p90_ms"] <= data["p99_ms"]
    assert data["throughput_per_s"] > 0 and data["load_ms"] > 0
    assert data["edgetpu_version"] is None  # the CPU: no libedgetpu was loaded


def test_benchmark_names_the_libedgetpu_it_used(models, tpu_env):
    """The double stands in for libedgetpu here; its edgetpu_version() says so."""
    r = run_cli(["infer", models["classifier"], "--benchmark", "--iterations", "5", "--json"], tpu_env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["edgetpu_version"] == "slurm-tpu test double of libedgetpu (no Edge TPU)"
    table = run_cli(["infer", models["classifier"], "--benchmark", "--iterations", "5"], tpu_env).stdout
    assert table.splitlines()[2].split() == [
        "libedgetpu",
        "slurm-tpu",
        "test",
        "double",
        "of",
        "libedgetpu",
        "(no",
        "Edge",
        "TPU)",
    ]


# -- Edge TPU: the allocated device, by path ------------------------------------------------


@pytest.mark.parametrize("order", [f"usb:{USB_A},usb:{USB_B}", f"usb:{USB_B},usb:{USB_A}"])
def test_opens_the_allocated_tpu_by_path_whatever_the_enumeration_order(models, tpu_env, order):
    env = dict(tpu_env, EDGETPU_DOUBLE_DEVICES=order)
    r = run_cli(
        [
            "infer",
            models["classifier"],
            models["images"] / "img_00001.png",
            "--labels",
            models["classifier_labels"],
            "-c",
            "1",
        ],
        env,
    )
    assert r.returncode == 0, r.stderr
    assert "Note: The first inference on Edge TPU is slow" in r.stdout
    assert r.stdout.splitlines()[-1] == "top: 0.99609"  # the delegate claimed nothing: CPU result
    log = double_log(env)
    assert [(e["call"], e["type"], e["path"]) for e in log] == [("create", "usb", USB_B), ("free", "usb", USB_B)]
    assert log[0]["options"] == "-"  # no "device=usb:N" index anywhere
    assert log[0]["pid"] != str(subprocess.os.getpid())


def test_cpu_model_on_a_tpu_warns_that_it_runs_on_the_cpu(models, tpu_env):
    r = run_cli(["infer", models["classifier"], models["images"] / "img_00001.png", "-c", "1"], tpu_env)
    assert r.returncode == 0
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("slurm-tpu: warning: model ") and "runs on the CPU" in r.stderr


def test_device_flag_overrides_the_environment(models, tpu_env):
    r = run_cli(
        ["infer", models["classifier"], models["images"] / "img_00001.png", "-c", "1", "--device", f"usb:{USB_A}"],
        tpu_env,
    )
    assert r.returncode == 0, r.stderr
    assert [e["path"] for e in double_log(tpu_env) if e["call"] == "create"] == [USB_A]


def test_device_cpu_flag_skips_the_tpu(models, tpu_env):
    r = run_cli(
        ["infer", models["classifier"], models["images"] / "img_00001.png", "-c", "1", "--device", "cpu"], tpu_env
    )
    assert r.returncode == 0 and r.stderr == ""
    assert double_log(tpu_env) == []


def test_several_tpus_one_interpreter_each_results_in_input_order(models, tpu_env, tmp_path):
    env = dict(tpu_env, SLURM_TPU_DEVICES="usb-2-1.3,usb-2-1.4", SLURM_TPU_EDGETPU_PATHS=f"usb:{USB_A},usb:{USB_B}")
    out_tpu, out_cpu = tmp_path / "tpu.jsonl", tmp_path / "cpu.jsonl"
    r = run_cli(["infer", models["classifier"], models["images"], "-o", out_tpu], env)
    assert r.returncode == 0, r.stderr
    r = run_cli(["infer", models["classifier"], models["images"], "-o", out_cpu, "--device", "cpu"], env)
    assert r.returncode == 0, r.stderr
    assert out_tpu.read_text() == out_cpu.read_text()
    creates = sorted(e["path"] for e in double_log(env) if e["call"] == "create")
    assert creates == [USB_A, USB_B]


def test_segmented_model_pipelines_over_two_tpus(models, tpu_env, tmp_path):
    env = dict(tpu_env, SLURM_TPU_DEVICES="usb-2-1.3,usb-2-1.4", SLURM_TPU_EDGETPU_PATHS=f"usb:{USB_A},usb:{USB_B}")
    whole, split = tmp_path / "whole.jsonl", tmp_path / "split.jsonl"
    assert (
        run_cli(["infer", models["classifier"], models["images"], "-o", whole, "--device", "cpu"], env).returncode == 0
    )
    r = run_cli(
        [
            "infer",
            models["classifier_segment_0"],
            "--segment",
            models["classifier_segment_1"],
            models["images"],
            "-o",
            split,
        ],
        env,
    )
    assert r.returncode == 0, r.stderr
    assert split.read_text() == whole.read_text()
    creates = [e["path"] for e in double_log(env) if e["call"] == "create"]
    assert creates == [USB_A, USB_B]  # segment i on allocated device i


def test_second_process_on_an_open_tpu_gets_in_use_by_pid(models, tpu_env):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from slurm_tpu.runner import Runner\n"
            f"r = Runner({str(models['classifier'])!r}, warn=lambda m: None)\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            f"print(r.classify({str(models['images'] / 'img_00002.png')!r})[0].index, flush=True)\n",
        ],
        env=tpu_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], tpu_env)
        line = _one_line_error(r)
        assert f"Edge TPU usb-2-1.4 is in use by pid {holder.pid}" in line
        # The first process was not disturbed: it still runs.
        out, _ = holder.communicate("go\n", timeout=60)
        assert out.strip() == "2" and holder.returncode == 0
    finally:
        holder.kill()
    # The loser never reached the device.
    assert [e["pid"] for e in double_log(tpu_env) if e["call"] == "create"] == [str(holder.pid)]


# -- one-line errors ------------------------------------------------------------------------


def test_error_edgetpu_model_without_tpu(models, clean_env):
    line = _one_line_error(
        run_cli(["infer", models["classifier_edgetpu"], models["images"] / "img_00001.png"], clean_env)
    )
    assert "compiled for the Edge TPU" in line and "--gres=tpu:1" in line


def test_error_libedgetpu_missing(models, tpu_env, tmp_path):
    env = dict(tpu_env, SLURM_TPU_LIBEDGETPU=str(tmp_path / "nowhere" / "libedgetpu.so.1"))
    line = _one_line_error(run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env))
    assert "libedgetpu" in line and "install" in line


def test_error_tpu_not_visible_to_libedgetpu(models, tpu_env):
    env = dict(tpu_env, EDGETPU_DOUBLE_DEVICES=f"usb:{USB_A}")  # the allocated 2-1.4 is unplugged
    line = _one_line_error(run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env))
    assert "usb-2-1.4" in line and USB_B in line
    # Not listed, so never opened: the real library would retry such a path for 25 s.
    assert double_log(env) == []


def test_error_tpu_node_cannot_be_opened(models, tpu_env):
    """Listed, but its usbfs node is gone: libedgetpu's own reason, in the runner's one line."""
    root = tpu_env["EDGETPU_DOUBLE_ROOT"]
    os.unlink(f"{root}/dev/bus/usb/002/006")  # the allocated 2-1.4's node
    line = _one_line_error(run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], tpu_env))
    assert f"libedgetpu cannot open Edge TPU usb-2-1.4 at usb:{USB_B}" in line
    assert "libedgetpu says: Unavailable: USB error -4 [OpenDevice]" in line
    assert [(e["call"], e["errno"]) for e in double_log(tpu_env)] == [("open-failed", "ENOENT")]


def test_error_segments_need_as_many_tpus(models, tpu_env):
    line = _one_line_error(
        run_cli(
            ["infer", models["classifier_segment_0"], "--segment", models["classifier_segment_1"], models["images"]],
            tpu_env,
        )
    )
    assert "2 model segments need 2 Edge TPUs" in line


def _gpu_works() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libvulkan.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_gpu_works(), reason="a Vulkan loader is present: the GPU may really work here")
def test_error_gpu_cannot_be_set_up_and_fallback(models, clean_env):
    image = models["images"] / "img_00008.png"
    line = _one_line_error(run_cli(["infer", models["classifier"], image, "--device", "gpu"], clean_env))
    assert "GPU could not be set up" in line and "--fallback cpu" in line
    env = dict(clean_env, CUDA_VISIBLE_DEVICES="0")  # a GPU job, no --device
    assert "GPU could not be set up" in _one_line_error(run_cli(["infer", models["classifier"], image], env))
    r = run_cli(
        [
            "infer",
            models["classifier"],
            image,
            "--fallback",
            "cpu",
            "--json",
            "-c",
            "1",
            "--labels",
            models["classifier_labels"],
        ],
        env,
    )
    assert r.returncode == 0
    assert r.stderr.startswith("slurm-tpu: warning: the GPU could not be set up") and r.stderr.count("\n") == 1
    assert json.loads(r.stdout)["classes"][0]["label"] == "bottom-right"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["MISSING_MODEL", "IMG"], "does not exist"),
        (["MODEL", "missing.png"], "input missing.png does not exist"),
        (["MODEL", "IMG", "--device", "usb:0"], "not an index"),
        (["MODEL", "IMG", "--device", "pci-0000:03:00.0"], "not cpu, gpu"),
        (["MODEL", "IMG", "--labels", "missing.txt"], "labels file missing.txt"),
        (["MODEL", "IMG", "--runtime", "tflite-runtime"], "tflite-runtime"),
    ],
)
def test_errors_are_one_line(models, clean_env, tmp_path, args, needle):
    subs = {
        "MODEL": str(models["classifier"]),
        "IMG": str(models["images"] / "img_00001.png"),
        "MISSING_MODEL": str(tmp_path / "missing.tflite"),
    }
    r = run_cli(["infer", *[subs.get(a, a) for a in args]], clean_env)
    assert needle in _one_line_error(r)
    assert r.returncode == 2


def test_error_inconsistent_job_environment(models, clean_env):
    env = dict(clean_env, SLURM_TPU_DEVICES="usb-2-1.3,usb-2-1.4", SLURM_TPU_EDGETPU_PATHS=f"usb:{USB_A}")
    assert "inconsistent" in _one_line_error(
        run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env)
    )


def test_error_edgetpu_model_the_runtime_does_not_take(models, tpu_env):
    """An Edge TPU model whose custom op no delegate claims (the double claims nothing)."""
    line = _one_line_error(
        run_cli(["infer", models["classifier_edgetpu"], models["images"] / "img_00001.png"], tpu_env)
    )
    assert "did not take its edgetpu-custom-op" in line
    assert [e["call"] for e in double_log(tpu_env)] == ["create", "free"]  # opened, then released cleanly
