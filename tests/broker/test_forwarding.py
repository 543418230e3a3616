"""Unmodified pycoral/tflite code on a TPU shard: the REAL libedgetpu (our two patches, built by
scripts/setup.sh) forwards each ``edgetpu-custom-op`` to a real broker process (issue 32, item 4).

What is real here: the patched libedgetpu loaded by ``load_delegate`` in a job's process (a real
unix user in a root-owned ``job_<J>`` cgroup), its enumeration, its delegate's claim of the op,
the frames on the job's endpoint, the broker's peer check, its ``load`` of the executable (the
one-op model it builds) and its figures. What is a twin: the broker runs in twin mode
(``--twin``), so the "executable" (the test model's custom options: the quantized CPU model's
own bytes, harness/modelgen/twin.py) runs as that CPU model through real TFLite, with the
device's delegate (the libedgetpu double) created on the device's node. No silicon here can run a
real executable: docs/limits.md says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from broker_support import BrokerProcess, temp_base

from helpers import USERS, real_libedgetpu
from slurm_tpu.protocol import broker_wire as wire

PROBE = Path(__file__).resolve().parent / "coral_probe.py"
RUNS = 5


@pytest.fixture(scope="module")
def library() -> str:
    return real_libedgetpu()


@pytest.fixture
def twin_broker(double):
    base = temp_base()
    process = BrokerProcess(base, double, extra=["--twin"]).start()
    yield process
    process.kill()
    shutil.rmtree(base, ignore_errors=True)


def job_env(visible: str) -> dict[str, str]:
    """A job's environment as the task prolog leaves it (nothing slurm-tpu besides the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_TPU_", "SLURM_JOB", "EDGETPU_"))}
    return dict(env, EDGETPU_VISIBLE_DEVICES=visible)


def coral(cgroups, job, library, model, cpu_model, visible, user=USERS[0], runs=RUNS) -> dict:
    """coral_probe.py as ``user`` in job ``job``'s cgroup (None: in none); its JSON line."""
    argv = cgroups.command(job, [sys.executable, str(PROBE), library, str(model), str(cpu_model), str(runs)], user)
    done = subprocess.run(argv, env=job_env(visible), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_lines(error: str) -> list[str]:
    """The lines our library said (load_delegate and TFLite add their own around them)."""
    return [line for line in error.splitlines() if line.startswith("libedgetpu: ")]


@pytest.mark.parametrize("name", ["classifier", "detector"])
def test_unmodified_code_on_a_shard_gets_the_cpu_models_answers(twin_broker, cgroups, users, models, library, name):
    uid = users[USERS[0]]
    endpoint = twin_broker.open(21, uid=uid, gid=uid, shares=2)
    result = coral(cgroups, 21, library, models[f"{name}_twin_edgetpu"], models[name], f"broker:{endpoint}")
    assert result.get("error") is None, result
    # pycoral's list_edge_tpus() shows the job its shard, as one USB Edge TPU named by its endpoint.
    assert result["listed"] == [f"usb:broker:{endpoint}"]
    assert (result["runs"], result["equal"]) == (RUNS, True)
    # Every invoke ran on the broker (the job's process has no interpreter for the op), once loaded.
    figures = twin_broker.control("stats")["jobs"]["21"]
    assert (figures[wire.INFERENCES], figures[wire.LOADS]) == (RUNS, 1)


def test_without_the_delegate_the_op_is_unresolved(models):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(models["classifier_twin_edgetpu"]))
    with pytest.raises(RuntimeError, match="unresolved custom op: edgetpu-custom-op"):
        interpreter.allocate_tensors()


def test_broker_down_fails_load_delegate_with_one_line(cgroups, users, models, library):
    base = temp_base()  # 0755, as the broker's directory is: nothing listens in it
    gone = f"{base}/jobs/9.sock"
    result = coral(cgroups, None, library, models["classifier_twin_edgetpu"], models["classifier"], f"broker:{gone}")
    assert result["stage"] == "load_delegate", result
    assert result["error"].splitlines()[0].startswith("Failed to load delegate from ")
    assert library_lines(result["error"]) == [
        f"libedgetpu: Edge TPU shard (broker:{gone}): the node's TPU broker is not running (nothing listens "
        f"at {gone}): the job's shares cannot be used; tell the node's admin (systemctl status slurm-tpu-broker)"
    ]
    shutil.rmtree(base)


def test_a_process_outside_the_job_and_another_user_are_refused(twin_broker, cgroups, users, models, library):
    uid = users[USERS[0]]
    endpoint = twin_broker.open(23, uid=uid, gid=uid)
    args = (library, models["classifier_twin_edgetpu"], models["classifier"], f"broker:{endpoint}")
    outside = coral(cgroups, None, *args)  # the job's user, not in the job
    assert outside["stage"] == "load_delegate", outside
    [line] = library_lines(outside["error"])
    assert line.startswith(f"libedgetpu: Edge TPU shard (broker:{endpoint}): the TPU broker refused this process: ")
    other = coral(cgroups, 23, *args, user=USERS[1])  # in the job's cgroup, but another user
    assert other["stage"] == "load_delegate", other
    assert library_lines(other["error"]) == [
        f"libedgetpu: Edge TPU shard (broker:{endpoint}): permission denied on {endpoint}: this TPU broker "
        "endpoint belongs to another user's job"
    ]
    assert twin_broker.control("stats")["jobs"]["23"][wire.INFERENCES] == 0


def paused(cgroups, job, library, models, endpoint) -> subprocess.Popen:
    argv = [sys.executable, str(PROBE), library, str(models["classifier_twin_edgetpu"]), str(models["classifier"])]
    process = subprocess.Popen(
        cgroups.command(job, [*argv, str(RUNS), "--pause"], USERS[0]),
        env=job_env(f"broker:{endpoint}"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert json.loads(process.stdout.readline()) == {"ready": True}, process.stderr.read() if process.stderr else ""
    return process


def resume(process: subprocess.Popen) -> dict:
    out, err = process.communicate("go\n", timeout=300)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_broker_gone_mid_job_fails_the_invoke_with_one_line(twin_broker, cgroups, users, models, library):
    uid = users[USERS[0]]
    endpoint = twin_broker.open(24, uid=uid, gid=uid)
    process = paused(cgroups, 24, library, models, endpoint)
    twin_broker.kill()  # a crash; the endpoint's file stays, nothing listens on it
    result = resume(process)
    assert (result["stage"], result["runs"]) == ("invoke", 1), result
    assert library_lines(result["error"]) == [
        f"libedgetpu: Edge TPU shard (broker:{endpoint}): the node's TPU broker is not running (nothing listens "
        f"at {endpoint}): the job's shares cannot be used; tell the node's admin (systemctl status slurm-tpu-broker)"
    ]


def test_a_restarted_broker_serves_the_job_on(twin_broker, cgroups, users, models, library):
    uid = users[USERS[0]]
    endpoint = twin_broker.open(25, uid=uid, gid=uid)
    process = paused(cgroups, 25, library, models, endpoint)
    twin_broker.kill()
    twin_broker.start()  # re-opens the job's endpoint from its grant
    result = resume(process)
    assert result.get("error") is None and (result["runs"], result["equal"]) == (RUNS, True), result
    # The new broker loaded the executable again (its models died with the old one) and ran the rest.
    figures = twin_broker.control("stats")["jobs"]["25"]
    assert figures[wire.LOADS] == 1 and figures[wire.INFERENCES] >= RUNS - 1


def test_a_broker_not_in_twin_mode_runs_the_executable_as_a_one_op_model(broker, cgroups, users, models, library):
    """Without --twin the broker builds the one-op model and opens it with the device's delegate, as on
    a node; the double (no silicon) claims no op, so TFLite cannot resolve it: one line, from the broker."""
    uid = users[USERS[0]]
    endpoint = broker.open(26, uid=uid, gid=uid)
    result = coral(cgroups, 26, library, models["classifier_twin_edgetpu"], models["classifier"], f"broker:{endpoint}")
    assert result["stage"] == "interpreter", result
    [line] = library_lines(result["error"])
    assert line.startswith(
        f"libedgetpu: Edge TPU shard (broker:{endpoint}): the TPU broker cannot run this Edge TPU executable: "
    )
    assert "edgetpu-custom-op" in line


def test_the_double_lists_no_device_for_a_broker_entry(double, tmp_path):
    """The libedgetpu double (the tests' stand-in for a node's library) keeps its contract for a shard's
    value: a broker entry names no device of its own, so it lists only the whole ones; it does not
    forward (the real library does)."""
    code = (
        "import ctypes, json, sys\n"
        "class D(ctypes.Structure): _fields_ = [('type', ctypes.c_int), ('path', ctypes.c_char_p)]\n"
        "lib = ctypes.CDLL(sys.argv[1]); lib.edgetpu_list_devices.restype = ctypes.POINTER(D)\n"
        "n = ctypes.c_size_t(); d = lib.edgetpu_list_devices(ctypes.byref(n))\n"
        "print(json.dumps([d[i].path.decode() for i in range(n.value)]))\n"
    )
    stick = "/sys/bus/usb/devices/2-1.3"
    for visible, expected in ((f"broker:{tmp_path}/1.sock", []), (f"{stick},broker:{tmp_path}/1.sock", [stick])):
        env = dict(os.environ, EDGETPU_DOUBLE_DEVICES=f"usb:{stick}", EDGETPU_VISIBLE_DEVICES=visible)
        done = subprocess.run([sys.executable, "-c", code, str(double)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == expected
