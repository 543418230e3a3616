"""``slurm-tpu infer``: run a TFLite model on the job's Edge TPU, GPU or CPU.

The options become an :class:`~slurm_tpu.runner.request.InferRequest` for
:func:`slurm_tpu.runner.dispatch.infer`; this renders what comes back.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ..runner import choices
from ..runner.request import BatchOptions, InferRequest, Reading, RemoteOptions
from .group import main
from .options import grouped, open_options, preprocessing_options, task_option

if TYPE_CHECKING:
    from ..runner.dispatch import RemoteTimed, Timed

EXIT_SOME_FAILED = 1


def _batch_options(no_progress: bool, **values: Any) -> BatchOptions:
    return BatchOptions(progress=not no_progress, **values)


@main.command("infer", context_settings={"max_content_width": 100})
@click.argument("args", nargs=-1, metavar="MODEL INPUTS...")
@click.option(
    "-m", "--model", "model_option", metavar="FILE", help="The model (as pycoral's examples); else the first argument."
)
@click.option(
    "-i",
    "--input",
    "input_options",
    multiple=True,
    metavar="PATH",
    help="An input (as pycoral's examples); repeatable, adds to INPUTS.",
)
@click.option(
    "--segment",
    "segments",
    multiple=True,
    metavar="FILE",
    help="Further segments of a model split by edgetpu_compiler --num_segments (MODEL is segment 0).",
)
@grouped(
    "reading",
    Reading,
    task_option(
        "What the outputs mean; auto recognises it from the model's outputs "
        "(TFLite_Detection_PostProcess -> detect, one [1,N] -> classify, [1,H,W(,C)] -> segment)."
    ),
    click.option("--raw", is_flag=True, help="Same as --task raw: dequantized outputs."),
    click.option("-l", "--labels", "labels", metavar="FILE", help="Labels: one per line, or '<id> <label>' lines."),
    click.option(
        "-k",
        "--top-k",
        "--top_k",
        "top_k",
        default=Reading.top_k,
        type=click.IntRange(1),
        help="Classify: classes to report.",
    ),
    click.option(
        "-t",
        "--threshold",
        type=float,
        help="Minimum score to report (default: 0.4 for detect, as detect_image.py; else 0).",
    ),
)
@click.option(
    "-c",
    "--count",
    default=InferRequest.count,
    type=click.IntRange(1),
    help="Single input: inferences to time (the first includes the Edge TPU model upload).",
)
@click.option("--json", "as_json", is_flag=True, help="Single input / benchmark: print JSON.")
@click.option(
    "--annotate",
    "annotate_dir",
    metavar="DIR",
    help="Write a copy of each image input with its results drawn (detect: boxes and labels; "
    "classify: labels; segment: the colour mask) as DIR/<name>.png.",
)
@grouped(
    "batch",
    _batch_options,
    click.option(
        "-o",
        "--output",
        metavar="FILE",
        help="Batch results file (JSONL, or CSV by suffix); resumed if it exists. sbatch patterns: "
        "%j job, %t task, %N node, %n node index, %s step, %A/%a array job/task, %u user, "
        "%x job name. (detect_image.py's -o FILE, the annotated image, is --annotate DIR here.)",
    ),
    click.option(
        "--format", "fmt", type=click.Choice(choices.RESULT_FORMATS), help="Results format (default: by suffix)."
    ),
    click.option(
        "--shard-index",
        type=click.IntRange(0),
        help="This process's share (default: from SLURM_ARRAY_TASK_* and the step's SLURM_PROCID).",
    ),
    click.option("--shard-count", type=click.IntRange(1), help="Number of shares."),
    click.option("--decode-threads", type=click.IntRange(1), help="Threads decoding inputs ahead of the device."),
    click.option(
        "--progress-interval",
        default=BatchOptions.progress_interval,
        type=float,
        help="Seconds between progress lines when stderr is not a terminal.",
    ),
    click.option("--no-progress", is_flag=True, help="No progress output."),
)
@preprocessing_options(pycoral_spellings=True)
@open_options()
@grouped(
    "remote",
    RemoteOptions,
    click.option(
        "--server",
        metavar="JOBID|HOST:PORT",
        help="Send the inputs to 'slurm-tpu serve' in that job (MODEL: the served name) instead of "
        "opening a device here.",
    ),
    click.option(
        "--in-flight",
        default=RemoteOptions.in_flight,
        type=click.IntRange(1, 256),
        help="With --server: requests in flight at once.",
    ),
)
@click.option("--benchmark", is_flag=True, help="Benchmark: load time, latency p50/p90/p99, throughput.")
@click.option("--iterations", default=InferRequest.iterations, type=click.IntRange(1), help="Benchmark iterations.")
def infer(
    args: tuple[str, ...], model_option: str | None, input_options: tuple[str, ...], as_json: bool, **fields: Any
) -> None:
    """Run MODEL on INPUTS (images, .npy, directories, globs, @list files) on this job's device.

    \b
    One input:  pycoral-style timing and result lines (or --json):
                classify 'label: score', detect 'label: score (xmin, ymin, xmax, ymax)'.
    Batch:      one record per input in --output, resumable, sharded over array tasks
                and over the tasks of a step (srun -N 4 --ntasks-per-node=1 ...).
    Benchmark:  --benchmark [INPUT] times the model on the device.
    pycoral's classify_image.py/detect_image.py flags work as they are (-m -i -l -k -t -c -a -s).
    Remote:     --server JOBID sends them to 'slurm-tpu serve' in that job (MODEL: its served name).
    """
    from ..runner.dispatch import BatchDone, RemoteTimed, Streams, Timed, infer as run
    from ..runner.errors import UsageError

    model = model_option or (args[0] if args else None)
    if model is None:
        raise UsageError("no model: give MODEL (or -m/--model) before the inputs")
    # The other options are InferRequest's fields by name (the grouped ones already built).
    inputs = tuple(args[0 if model_option else 1 :]) + input_options
    request = InferRequest(model=model, inputs=inputs, **fields)
    streams = Streams(
        write=lambda text: click.echo(text, nl=False),
        warn=lambda message: click.echo(f"slurm-tpu: warning: {message}", err=True),
        task_recognised=lambda name: click.echo(
            f"slurm-tpu: task: {name} (recognised from the model's outputs; --task overrides)", err=True
        ),
        progress=sys.stderr,
    )
    outcome = run(request, streams)
    if isinstance(outcome, Timed):
        _print_timed(outcome, as_json)
    elif isinstance(outcome, RemoteTimed):
        _print_remote(outcome, as_json)
    elif isinstance(outcome, BatchDone):
        if outcome.errors:
            click.echo(
                f"slurm-tpu: {outcome.errors} of {outcome.processed} inputs failed; "
                f"see the error fields in {outcome.output or 'the output'}",
                err=True,
            )
            sys.exit(EXIT_SOME_FAILED)
    else:  # a benchmark
        click.echo(json.dumps(outcome.as_dict(), indent=2) if as_json else outcome.table(), nl=as_json)


def _print_timed(timed: Timed, as_json: bool) -> None:
    task = timed.task
    if as_json:
        head = {"input": timed.input, "task": task.name, "devices": timed.devices, "runtime": timed.runtime}
        annotated = {"annotated": timed.annotated} if timed.annotated else {}
        load = {"load_ms": round(timed.load_seconds * 1000, 3)}
        _print_json({**head, **load}, timed.times, {**task.record(timed.result), **annotated})
        return
    # The layout of pycoral's examples (classify_image.py, detect_image.py), so existing job
    # scripts keep parsing it.
    note = "Note: The first inference on Edge TPU is slow because it includes loading the model into Edge TPU memory."
    pointer = f"Please check {timed.annotated}"  # semantic_segmentation.py's pointer to its picture
    _print_lines(
        ["----INFERENCE TIME----", *([note] if timed.on_edgetpu else [])],
        [task.time_format.format(t) for t in timed.times],
        [*task.lines(timed.result), *([pointer] if timed.annotated else [])],
    )


def _print_remote(timed: RemoteTimed, as_json: bool) -> None:
    from ..runner.serve.client import result_fields

    record = timed.record
    if as_json:
        head = {"input": timed.input, "task": timed.task.name, "devices": record.get("devices", [])}
        server = {"runtime": record.get("runtime", ""), "server": timed.server}
        _print_json({**head, **server}, timed.times, result_fields(record))
        return
    times = [timed.task.time_format.format(t) for t in timed.times]
    # The lines: the task's own printout, made by the server.
    _print_lines([f"----ROUND TRIP TIME ({timed.server})----"], times, record.get("lines", []))


def _print_json(head: dict, times: list[float], tail: dict) -> None:
    """One input's JSON record: ``head``, the times (ms, the first apart), ``tail``."""
    click.echo(
        json.dumps({**head, "first_ms": round(times[0], 3), "times_ms": [round(t, 3) for t in times[1:]], **tail})
    )


def _print_lines(heading: list[str], times: list[str], results: list[str]) -> None:
    for line in [*heading, *times, "-------RESULTS--------", *results]:
        click.echo(line)
