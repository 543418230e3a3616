"""The CLI's options: each declared once, with the runner's choices and defaults, grouped into typed values."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from slurm_tpu.cli import main
from slurm_tpu.cli.options import grouped
from slurm_tpu.runner import choices, dispatch
from slurm_tpu.runner.request import BatchOptions, InferRequest, OpenOptions, Preprocessing, Reading, RemoteOptions


def _option(command: str, flag: str) -> click.Parameter:
    return next(p for p in main.commands[command].params if flag in p.opts)


def test_infer_and_serve_offer_the_runners_choices():
    for command in ("infer", "serve"):
        assert tuple(_option(command, "--task").type.choices) == (choices.AUTO, *choices.TASK_NAMES)
        assert _option(command, "--task").default == Reading.task
        assert tuple(_option(command, "--runtime").type.choices) == choices.RUNTIMES
        assert _option(command, "--runtime").envvar == choices.RUNTIME_ENV
        assert tuple(_option(command, "--fallback").type.choices) == choices.FALLBACKS
    assert tuple(_option("infer", "--format").type.choices) == choices.RESULT_FORMATS


@pytest.mark.parametrize("command", ["infer", "serve", "doctor", "metrics", "detect"])
def test_libedgetpu_is_one_option_everywhere(command):
    option = _option(command, "--libedgetpu")
    assert option.envvar == choices.LIBEDGETPU_ENV and option.metavar == "PATH"
    assert f"(env {choices.LIBEDGETPU_ENV}; default: the system's)" in option.help


def test_the_cli_imports_neither_numpy_nor_a_runtime():
    """Every command (health, run by slurmd, included) declares the runner's options at start-up."""
    code = (
        "import sys, slurm_tpu.cli\n"
        "print(sorted(m for m in ('numpy', 'ctypes', 'slurm_tpu.runner.api', 'slurm_tpu.runner.engines') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\n"


@pytest.fixture
def requests(monkeypatch) -> list[InferRequest]:
    """The requests `slurm-tpu infer` hands the runner (which runs none of them here)."""
    seen: list[InferRequest] = []

    def infer(request: InferRequest, streams: dispatch.Streams) -> dispatch.BatchDone:
        seen.append(request)
        return dispatch.BatchDone(processed=0, errors=0, output=None)

    monkeypatch.setattr(dispatch, "infer", infer)
    return seen


def test_infer_with_no_options_asks_for_the_requests_defaults(requests):
    result = CliRunner().invoke(main, ["infer", "m.tflite", "a.png"])
    assert result.exit_code == 0, result.output
    assert requests == [InferRequest(model="m.tflite", inputs=("a.png",))]


def test_infer_groups_its_options_into_the_request(requests):
    args = [
        "infer",
        "-m",
        "m.tflite",
        "-i",
        "b.png",
        "a.png",
        "--segment",
        "s1.tflite",
        "--raw",
        "-l",
        "labels.txt",
        "-k",
        "3",
        "-t",
        "0.2",
        "-c",
        "2",
        "--annotate",
        "out",
        "-o",
        "r.csv",
        "--format",
        "csv",
        "--shard-index",
        "1",
        "--shard-count",
        "4",
        "--decode-threads",
        "2",
        "--progress-interval",
        "5",
        "--no-progress",
        "--fast-resize",
        "--keep_aspect_ratio",
        "-a",
        "127.5",
        "--input_std",
        "128",
        "--device",
        "cpu",
        "--libedgetpu",
        "/lib/x.so",
        "--fallback",
        "cpu",
        "--runtime",
        "litert",
        "--threads",
        "3",
        "--server",
        "123",
        "--in-flight",
        "4",
        "--benchmark",
        "--iterations",
        "7",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert requests == [
        InferRequest(
            model="m.tflite",
            inputs=("a.png", "b.png"),
            segments=("s1.tflite",),
            reading=Reading(task=choices.AUTO, raw=True, labels="labels.txt", top_k=3, threshold=0.2),
            preprocessing=Preprocessing(input_mean=127.5, input_std=128.0, fast_resize=True, keep_aspect_ratio=True),
            opening=OpenOptions(
                device=("cpu",), libedgetpu="/lib/x.so", fallback="cpu", num_threads=3, runtime="litert"
            ),
            batch=BatchOptions(
                output="r.csv",
                fmt="csv",
                shard_index=1,
                shard_count=4,
                decode_threads=2,
                progress_interval=5.0,
                progress=False,
            ),
            remote=RemoteOptions(server="123", in_flight=4),
            count=2,
            benchmark=True,
            iterations=7,
            annotate_dir="out",
        )
    ]


def test_infer_without_a_model_is_a_usage_error(requests):
    result = CliRunner().invoke(main, ["infer"])
    assert result.exit_code == 2 and not requests
    assert result.output == "slurm-tpu: error: no model: give MODEL (or -m/--model) before the inputs\n"


@dataclass(frozen=True)
class _Pair:
    left: int = 1
    right: str = "r"


def test_grouped_options_reach_the_command_as_one_value_and_keep_their_order():
    got = []

    @click.command()
    @click.option("--first", default=0)
    @grouped("pair", _Pair, click.option("--left", type=int, default=_Pair.left), click.option("--right"))
    @click.option("--last", is_flag=True)
    def command(first: int, pair: _Pair, last: bool) -> None:
        got.append((first, pair, last))

    result = CliRunner().invoke(command, ["--right", "x", "--last", "--first", "2"])
    assert result.exit_code == 0, result.output
    assert got == [(2, _Pair(1, "x"), True)]
    help_lines = CliRunner().invoke(command, ["--help"]).output.splitlines()
    flags = [line.split()[0] for line in help_lines if line.startswith("  --")]
    assert flags == ["--first", "--left", "--right", "--last", "--help"]
