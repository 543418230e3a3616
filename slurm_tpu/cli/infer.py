"""``slurm-tpu infer``: run a TFLite model on the job's Edge TPU, GPU or CPU."""

from __future__ import annotations

import json
import os
import sys

import click

from .group import main

EXIT_SOME_FAILED = 1


def _warn(message: str) -> None:
    click.echo(f"slurm-tpu: warning: {message}", err=True)


def _is_batch(inputs: tuple[str, ...], output: str | None) -> bool:
    from ..runner.preprocess import is_input_file

    if output or len(inputs) != 1:
        return True
    only = inputs[0]
    return only.startswith("@") or os.path.isdir(only) or not is_input_file(only)


@main.command("infer", context_settings={"max_content_width": 100})
@click.argument("args", nargs=-1, metavar="MODEL INPUTS...")
@click.option("-m", "--model", "model_option", metavar="FILE",
              help="The model (as pycoral's examples); else the first argument.")
@click.option("-i", "--input", "input_options", multiple=True, metavar="PATH",
              help="An input (as pycoral's examples); repeatable, adds to INPUTS.")
@click.option("--task", type=click.Choice(["auto", "classify", "detect", "segment", "raw"]), default="auto",
              show_default=True, help="What the outputs mean; auto recognises it from the model's outputs "
              "(TFLite_Detection_PostProcess -> detect, one [1,N] -> classify, [1,H,W(,C)] -> segment).")
@click.option("-l", "--labels", "labels", metavar="FILE", help="Labels: one per line, or '<id> <label>' lines.")
@click.option("-k", "--top-k", "--top_k", "top_k", default=1, show_default=True, type=click.IntRange(1),
              help="Classify: classes to report.")
@click.option("-t", "--threshold", type=float,
              help="Minimum score to report (default: 0.4 for detect, as detect_image.py; else 0).")
@click.option("-c", "--count", default=5, show_default=True, type=click.IntRange(1),
              help="Single input: inferences to time (the first includes the Edge TPU model upload).")
@click.option("--json", "as_json", is_flag=True, help="Single input / benchmark: print JSON.")
@click.option("-o", "--output", metavar="FILE",
              help="Batch results file (JSONL, or CSV by suffix); resumed if it exists. sbatch patterns: "
              "%j job, %t task, %N node, %n node index, %s step, %A/%a array job/task, %u user, %x job name. "
              "(detect_image.py's -o FILE, the annotated image, is --annotate DIR here.)")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), help="Results format (default: by suffix).")
@click.option("--annotate", "annotate_dir", metavar="DIR",
              help="Write a copy of each image input with its results drawn (detect: boxes and labels; "
              "classify: labels; segment: the colour mask) as DIR/<name>.png.")
@click.option("--raw", is_flag=True, help="Same as --task raw: dequantized outputs.")
@click.option("--fast-resize", is_flag=True,
              help="Decode JPEGs at reduced scale and resize BILINEAR: faster, but inputs (and scores) differ "
              "from pycoral's LANCZOS.")
@click.option("--keep-aspect-ratio", "--keep_aspect_ratio", "keep_aspect_ratio", is_flag=True,
              help="Segment: pad instead of stretching (as semantic_segmentation.py); detect always pads.")
@click.option("--device", "devices", multiple=True, metavar="DEV",
              help="Override: identity (usb-2-1.3), usb:PATH, pci:PATH, cpu or gpu; repeat or comma-separate.")
@click.option("--libedgetpu", metavar="PATH", envvar="SLURM_TPU_LIBEDGETPU",
              help="libedgetpu.so.1 to use (env SLURM_TPU_LIBEDGETPU).")
@click.option("--fallback", type=click.Choice(["cpu"]), help="Run on the CPU when the GPU cannot be set up.")
@click.option("--runtime", type=click.Choice(["litert", "tflite-runtime"]), envvar="SLURM_TPU_RUNTIME",
              help="TFLite runtime (default: LiteRT if installed, else tflite-runtime).")
@click.option("--threads", type=click.IntRange(1), help="CPU threads per interpreter (default: CPUs / devices).")
@click.option("--segment", "segments", multiple=True, metavar="FILE",
              help="Further segments of a model split by edgetpu_compiler --num_segments (MODEL is segment 0).")
@click.option("--shard-index", type=click.IntRange(0),
              help="This process's share (default: from SLURM_ARRAY_TASK_* and the step's SLURM_PROCID).")
@click.option("--shard-count", type=click.IntRange(1), help="Number of shares.")
@click.option("--decode-threads", type=click.IntRange(1), help="Threads decoding inputs ahead of the device.")
@click.option("-a", "--input-mean", "--input_mean", "input_mean", type=float,
              help="Image normalisation mean (as pycoral's --input_mean; default: the model's quantization).")
@click.option("-s", "--input-std", "--input_std", "input_std", type=float,
              help="Image normalisation std (as pycoral's --input_std).")
@click.option("--progress-interval", default=30.0, show_default=True, type=float,
              help="Seconds between progress lines when stderr is not a terminal.")
@click.option("--no-progress", is_flag=True, help="No progress output.")
@click.option("--server", metavar="JOBID|HOST:PORT",
              help="Send the inputs to 'slurm-tpu serve' in that job (MODEL: the served name) instead of "
              "opening a device here.")
@click.option("--in-flight", default=8, show_default=True, type=click.IntRange(1, 256),
              help="With --server: requests in flight at once.")
@click.option("--benchmark", "bench", is_flag=True, help="Benchmark: load time, latency p50/p90/p99, throughput.")
@click.option("--iterations", default=100, show_default=True, type=click.IntRange(1), help="Benchmark iterations.")
def infer(args: tuple[str, ...], model_option: str | None, input_options: tuple[str, ...], task: str,
          labels: str | None, top_k: int, threshold: float | None, count: int, as_json: bool,
          output: str | None, fmt: str | None, annotate_dir: str | None, raw: bool, fast_resize: bool,
          keep_aspect_ratio: bool, devices: tuple[str, ...], libedgetpu: str | None, fallback: str | None,
          runtime: str | None, threads: int | None, segments: tuple[str, ...], shard_index: int | None,
          shard_count: int | None, decode_threads: int | None, input_mean: float | None,
          input_std: float | None, progress_interval: float, no_progress: bool, server: str | None,
          in_flight: int, bench: bool, iterations: int) -> None:
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
    from ..runner import OpenOptions, Runner
    from ..runner.errors import UsageError
    from ..runner.inputs import expand_output_pattern, list_inputs, shard, shard_from_environment
    from ..runner.preprocess import Normalization
    from ..runner.progress import Progress
    from ..runner.results import format_for

    model = model_option or (args[0] if args else None)
    inputs = tuple(args[0 if model_option else 1:]) + input_options
    if model is None:
        raise UsageError("no model: give MODEL (or -m/--model) before the inputs")
    if raw:
        if task not in ("auto", "raw"):
            raise UsageError(f"--raw contradicts --task {task}")
        task = "raw"
    if (shard_index is None) != (shard_count is None):
        raise UsageError("--shard-index and --shard-count go together")
    if not inputs and not bench:
        raise UsageError("no inputs: give image/.npy files, a directory, a glob or @list (or --benchmark)")
    batch = not bench and _is_batch(inputs, output)
    keys: list[str] = []
    listed: list[str] = []
    if batch:
        # List and shard before opening the device: a bad input path fails in milliseconds.
        keys = listed = list_inputs(inputs)
        share = (shard_index, shard_count) if shard_count is not None else shard_from_environment(os.environ)
        if share is not None:
            if shard_count is not None and share[0] >= share[1]:  # type: ignore[operator]
                raise UsageError(f"--shard-index {shard_index} must be below --shard-count {shard_count}")
            keys = shard(keys, *share)  # type: ignore[arg-type]
    if server:
        local_only = {"--labels": labels, "--annotate": annotate_dir, "--device": devices, "--segment": segments,
                      "--fallback": fallback, "--threads": threads, "--benchmark": bench, "--fast-resize": fast_resize,
                      "--keep-aspect-ratio": keep_aspect_ratio, "--input-mean": input_mean is not None,
                      "--input-std": input_std is not None}
        given = [flag for flag, value in local_only.items() if value]
        if given:
            raise UsageError(f"{', '.join(given)}: set at the server ('slurm-tpu serve'), not with --server")
        _remote(server, model, inputs[0] if not batch else None, keys, task, top_k, threshold, count, as_json,
                output, fmt, in_flight, Progress(len(keys), sys.stderr, progress_interval, enabled=not no_progress))
        return
    options = OpenOptions(device=devices, libedgetpu=libedgetpu, fallback=fallback,
                          num_threads=threads, runtime=runtime)
    model_files = [model, *segments]
    with Runner(model_files if segments else model, labels, options, warn=_warn,
                normalization=Normalization(input_mean, input_std), task=task, fast_resize=fast_resize,
                keep_aspect_ratio=keep_aspect_ratio) as runner:
        task_options = runner.options(top_k, threshold)
        if bench:
            result = runner.benchmark(iterations, inputs[0] if inputs else None)
            click.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.table(), nl=as_json)
        elif batch:
            out = expand_output_pattern(output, os.environ) if output else None
            if annotate_dir:
                runner.check_annotate(annotate_dir, listed)  # all shares: names must not collide across tasks
            if runner.task_reason != "--task" and not no_progress:
                # Said in the job's log next to the progress lines; a single input's printout
                # (and its --json "task") shows the task by itself.
                click.echo(f"slurm-tpu: task: {runner.task.name} (recognised from the model's outputs; "
                           "--task overrides)", err=True)
            progress = Progress(len(keys), sys.stderr, progress_interval, enabled=not no_progress)
            summary = runner.run_batch(keys, out, format_for(out or "", fmt), task_options, decode_threads,
                                       progress, expand=False, stdout_write=lambda s: click.echo(s, nl=False),
                                       annotate_dir=annotate_dir)
            if summary.errors:
                click.echo(f"slurm-tpu: {summary.errors} of {summary.processed} inputs failed; "
                           f"see the error fields in {out or 'the output'}", err=True)
                sys.exit(EXIT_SOME_FAILED)
        else:
            _single(runner, inputs[0], count, task_options, as_json, annotate_dir)


def _single(runner, path: str, count: int, options, as_json: bool, annotate_dir: str | None) -> None:
    from ..runner.api import annotated_path

    result, times = runner.run_timed(path, count, options)
    task = runner.task
    annotated = None
    if annotate_dir:
        runner.check_annotate(annotate_dir, [path])
        annotated = annotated_path(annotate_dir, path)
        task.annotate(path, result, annotated)
    if as_json:
        record = {
            "input": path, "task": task.name, "devices": runner.device_labels, "runtime": runner.engine_set.runtime,
            "load_ms": round(runner.engine_set.load_seconds * 1000, 3),
            "first_ms": round(times[0], 3), "times_ms": [round(t, 3) for t in times[1:]],
            **task.record(result),
        }
        if annotated:
            record["annotated"] = annotated
        click.echo(json.dumps(record))
        return
    # The layout of pycoral's examples (classify_image.py, detect_image.py), so existing job
    # scripts keep parsing it.
    click.echo("----INFERENCE TIME----")
    if runner.on_edgetpu:
        click.echo("Note: The first inference on Edge TPU is slow because it includes loading the "
                   "model into Edge TPU memory.")
    for t in times:
        click.echo(task.time_format.format(t))
    click.echo("-------RESULTS--------")
    for line in task.lines(result):
        click.echo(line)
    if annotated:
        click.echo(f"Please check {annotated}")  # semantic_segmentation.py's pointer to its picture


def _remote(target: str, model: str, single: str | None, keys: list[str], task: str, top_k: int,
            threshold: float | None, count: int, as_json: bool, output: str | None, fmt: str | None,
            in_flight: int, progress) -> None:
    """``infer --server``: the same inputs and outputs as local inference, answered by a server."""
    from ..runner.api import _StdoutWriter
    from ..runner.inputs import expand_output_pattern
    from ..runner.results import Layout, ResultWriter, format_for
    from ..runner.serve.client import (RemoteModel, ServeClient, model_name, resolve_target, result_fields, timed,
                                       write_remote_batch)
    from ..runner.tasks import TaskOptions

    client = ServeClient(resolve_target(target))
    try:
        remote = RemoteModel(client, model_name(model), task)
        options = {"top_k": top_k, "threshold": threshold}
        if single is not None:
            record, times = timed(remote, single, count, options)
            if as_json:
                click.echo(json.dumps({"input": single, "task": remote.task.name, "devices": record.get("devices", []),
                                       "runtime": record.get("runtime", ""), "server": client.url,
                                       "first_ms": round(times[0], 3), "times_ms": [round(t, 3) for t in times[1:]],
                                       **result_fields(record)}))
                return
            click.echo(f"----ROUND TRIP TIME ({client.url})----")
            for t in times:
                click.echo(remote.task.time_format.format(t))
            click.echo("-------RESULTS--------")
            for line in record.get("lines", []):  # the task's own printout, made by the server
                click.echo(line)
            return
        out = expand_output_pattern(output, os.environ) if output else None
        layout = Layout(format_for(out or "", fmt), remote.task, TaskOptions(top_k=top_k, threshold=threshold))
        writer = ResultWriter(out, layout) if out else _StdoutWriter(layout, lambda s: click.echo(s, nl=False))
        processed, errors = write_remote_batch(remote, keys, writer, options, in_flight, progress)
        if errors:
            click.echo(f"slurm-tpu: {errors} of {processed} inputs failed; see the error fields in "
                       f"{out or 'the output'}", err=True)
            sys.exit(EXIT_SOME_FAILED)
    finally:
        client.close()

