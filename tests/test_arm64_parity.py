"""The arm64 leg's comparison of runner results across architectures (harness/arm64/parity.py):
what it accepts (raw integer outputs within one quantization step, reported) and what fails it."""

from __future__ import annotations

import copy

from harness.arm64.parity import RAW_STEPS, compare


def _record(machine: str, output: bytes, dtype: str = "uint8", result: str = "[Class(index=1)]") -> dict:
    entry = {
        "image": "i",
        "input": "t",
        "result": result,
        "outputs": [{"dtype": dtype, "shape": [1, len(output)], "hex": output.hex()}],
    }
    return {"machine": machine, "models": {"m.tflite": {"model": "m", "inputs": {"a.png": entry}}}}


def test_identical_records_have_no_failures_and_no_notes():
    record = _record("x86_64", bytes([10, 20, 30]))
    assert compare(record, copy.deepcopy(record)) == ([], [])


def test_an_integer_output_one_step_off_is_a_note_not_a_failure():
    failures, notes = compare(_record("x86_64", bytes([10, 20, 30])), _record("aarch64", bytes([10, 21, 30])))
    assert failures == []
    assert notes == ["m.tflite a.png: output 0 (uint8): 1 elements differ, by at most 1"]


def test_an_integer_output_further_off_fails():
    failures, notes = compare(
        _record("x86_64", bytes([10, 20, 30])), _record("aarch64", bytes([10, 20 + RAW_STEPS + 1, 29]))
    )
    assert notes == []
    assert failures == [f"m.tflite a.png: output 0 (uint8): 2 elements differ, by at most {RAW_STEPS + 1}"]


def test_any_float_difference_fails():
    import numpy as np

    a = np.array([0.5, 0.25], dtype=np.float32).tobytes()
    b = np.array([0.5, 0.2500001], dtype=np.float32).tobytes()
    failures, _ = compare(_record("x86_64", a, "float32"), _record("aarch64", b, "float32"))
    assert len(failures) == 1 and "(float32): 1 elements differ" in failures[0]


def test_a_different_result_fails_even_with_equal_outputs():
    failures, _ = compare(
        _record("x86_64", bytes([1]), result="[Class(index=1)]"),
        _record("aarch64", bytes([1]), result="[Class(index=2)]"),
    )
    assert failures == ["m.tflite a.png: result differs (x86_64 vs aarch64): [Class(index=1)] != [Class(index=2)]"]


def test_different_model_files_are_named_and_not_compared_further():
    other = _record("aarch64", bytes([99]))
    other["models"]["m.tflite"]["model"] = "another"
    failures, notes = compare(_record("x86_64", bytes([1])), other)
    assert failures == ["m.tflite: the model files differ, the comparison means nothing"] and notes == []
