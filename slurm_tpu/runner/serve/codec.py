"""Request and response bodies: TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest)
and our task endpoints, as docs/user-guide.md lists them.

Predict takes rows (``instances`` -> ``predictions``) or columns (``inputs`` -> ``outputs``);
a ``{"b64": ...}`` value is an encoded image (or .npy array), prepared exactly as
``slurm-tpu infer`` prepares files; outputs are the model's own tensors (uint8 stays
uint8), as TF Serving returns them. Errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, Callable
from urllib.parse import parse_qs

import numpy as np

from ..modelinfo import TensorSpec

VERSION = "1"  # one version per served model
# TF Serving's names of the dtypes models use (metadata), both ways
DTYPES = {"float16": "DT_HALF", "float32": "DT_FLOAT", "float64": "DT_DOUBLE"} | {
    name: f"DT_{name.upper()}" for name in ("uint8", "int8", "int16", "int32", "int64", "bool")
}


class RequestError(Exception):
    """A request the server refuses: the HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


# TF Serving's GetModelStatus answer for a loaded model
MODEL_STATUS = {
    "model_version_status": [
        {"version": VERSION, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
}


def _tensor_info(spec: TensorSpec) -> dict[str, Any]:
    return {
        "dtype": DTYPES.get(np.dtype(spec.dtype).name, "DT_INVALID"),
        "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False},
        "name": spec.name,
    }


def model_metadata(
    name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """TF Serving's GetModelMetadata answer (the signature), plus ``extra`` under ``slurm_tpu``."""
    signature = {
        "inputs": {s.name: _tensor_info(s) for s in inputs},
        "outputs": {s.name: _tensor_info(s) for s in outputs},
        "method_name": "tensorflow/serving/predict",
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": VERSION},
        "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}, "slurm_tpu": dict(extra)},
    }


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise RequestError(400, "the body is not UTF-8 JSON") from None
    except ValueError as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply") from None


def decode_b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise RequestError(400, f"{where}: 'b64' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"{where}: 'b64' is not valid base64") from None


def _array(value: Any, spec: TensorSpec, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A JSON value (nested lists of numbers) as an array of ``spec``'s dtype and ``shape``."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise RequestError(
            400, f"{where}: not a rectangular array of numbers (input '{spec.name}' wants shape {list(shape)})"
        ) from None
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        kind = {"b": "booleans", "U": "strings", "S": "bytes", "O": "mixed values"}.get(array.dtype.kind, "non-numbers")
        raise RequestError(400, f"{where}: holds {kind}, input '{spec.name}' wants {np.dtype(spec.dtype).name} numbers")
    if array.shape != shape:
        raise RequestError(400, f"{where}: shape {list(array.shape)}, input '{spec.name}' wants {list(shape)}")
    dtype = np.dtype(spec.dtype)
    if dtype.kind in "iu":
        if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.round(array))):
            raise RequestError(400, f"{where}: input '{spec.name}' is {dtype.name}: give whole numbers")
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise RequestError(
                400, f"{where}: values outside {info.min}..{info.max} for {dtype.name} input '{spec.name}'"
            )
    return array.astype(dtype)


Binary = Callable[[bytes, str], np.ndarray]  # b64 bytes -> one instance's input (no batch dimension)


def _value(value: Any, spec: TensorSpec, shape: tuple[int, ...], where: str, binary: Binary) -> np.ndarray:
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise RequestError(400, f'{where}: an object value must be {{"b64": ...}}')
        return binary(decode_b64(value["b64"], where), where)
    return _array(value, spec, shape, where)


def _by_input(value: Any, specs: Sequence[TensorSpec], where: str) -> list[Any]:
    """Values in input order: the value itself (one input) or a dict by input name."""
    if len(specs) == 1 and not (isinstance(value, dict) and set(value) == {specs[0].name}):
        return [value]
    names = [s.name for s in specs]
    if not isinstance(value, dict) or set(value) != set(names):
        raise RequestError(400, f"{where}: give an object with the inputs {names}")
    return [value[n] for n in names]


def parse_predict(
    body: bytes, specs: Sequence[TensorSpec], binary: Binary, max_instances: int
) -> tuple[list[list[np.ndarray]], bool]:
    """A :predict body as per-inference input tensors (each with its batch dimension of 1),
    and whether it was columnar (``inputs``) rather than rows (``instances``)."""
    request = parse_json(body)
    if not isinstance(request, dict) or len({"instances", "inputs"} & set(request)) != 1:
        raise RequestError(400, "a predict request is an object with 'instances' (rows) or 'inputs' (columns)")
    rows = [s.shape[1:] for s in specs]
    if "instances" in request:
        instances = request["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError(400, "'instances' must be a non-empty list, one element per inference")
        _check_count(len(instances), max_instances)
        return [
            [
                _value(v, spec, tuple(row), f"instances[{i}]", binary)[np.newaxis]
                for v, spec, row in zip(_by_input(instance, specs, f"instances[{i}]"), specs, rows)
            ]
            for i, instance in enumerate(instances)
        ], False
    columns = _by_input(request["inputs"], specs, "inputs")
    per_input = []
    count = None
    for value, spec, row in zip(columns, specs, rows):
        if isinstance(value, dict) or not isinstance(value, list) or not value:
            raise RequestError(400, f"inputs: '{spec.name}' must be a non-empty list with the batch dimension first")
        _check_count(len(value), max_instances)
        if count is not None and len(value) != count:
            raise RequestError(400, "inputs: every input needs the same batch size")
        count = len(value)
        per_input.append(
            [
                _value(v, spec, tuple(row), f"inputs['{spec.name}'][{i}]", binary)[np.newaxis]
                for i, v in enumerate(value)
            ]
        )
    return [list(values) for values in zip(*per_input)], True


def _check_count(count: int, max_instances: int) -> None:
    if count > max_instances:
        raise RequestError(400, f"{count} instances in one request, at most {max_instances}: split the request")


def encode_predict(
    results: Sequence[Sequence[np.ndarray]], specs: Sequence[TensorSpec], columnar: bool
) -> dict[str, Any]:
    """Per-inference outputs as TF Serving answers them (``predictions`` rows or ``outputs``)."""
    if columnar:
        stacked = [np.concatenate([r[i] for r in results]).tolist() for i in range(len(specs))]
        return {"outputs": stacked[0] if len(specs) == 1 else {s.name: v for s, v in zip(specs, stacked)}}
    if len(specs) == 1:
        return {"predictions": [r[0][0].tolist() for r in results]}
    return {"predictions": [{s.name: out[0].tolist() for s, out in zip(specs, r)} for r in results]}


def task_request(body: bytes, content_type: str, query: str) -> tuple[bytes, dict[str, Any]]:
    """A task endpoint's input bytes and options (``top_k``, ``threshold``)."""
    options: dict[str, Any] = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
    if content_type.split(";")[0].strip().lower() == "application/json":
        request = parse_json(body)
        if not isinstance(request, dict) or "b64" not in request:
            raise RequestError(
                400, 'a JSON task request is {"b64": <image or .npy bytes>, "top_k": ..., "threshold": ...}'
            )
        data = decode_b64(request.pop("b64"), "b64")
        options.update(request)
    else:
        data = body
    if not data:
        raise RequestError(400, "empty body: send the image (or .npy) bytes")
    unknown = set(options) - {"top_k", "threshold"}
    if unknown:
        raise RequestError(400, f"unknown option(s) {', '.join(sorted(unknown))}: use top_k, threshold")
    parsed: dict[str, Any] = {}
    try:
        if "top_k" in options:
            parsed["top_k"] = int(options["top_k"])
            if parsed["top_k"] < 1:
                raise ValueError
        if "threshold" in options:
            parsed["threshold"] = float(options["threshold"])
            if not np.isfinite(parsed["threshold"]):
                raise ValueError
    except (TypeError, ValueError):
        raise RequestError(400, "top_k must be a whole number >= 1 and threshold a number") from None
    return data, parsed
