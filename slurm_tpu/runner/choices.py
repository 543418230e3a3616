"""The names a user chooses among to run a model, and the variables that stand in for options.

One place for each, for the modules that act on a name and the CLI's option choices. Stdlib-only,
nothing heavy: every ``slurm-tpu`` command declares its options at start-up, ``health`` run by
slurmd included.
"""

from __future__ import annotations

from .devices import CPU

# -- TFLite runtimes ---------------------------------------------------------------------
RUNTIME_ENV = "SLURM_TPU_RUNTIME"  # stands in for --runtime
# Each runtime, in order of preference, and the module holding its Interpreter.
RUNTIME_MODULES = {"litert": "ai_edge_litert.interpreter", "tflite-runtime": "tflite_runtime.interpreter"}
RUNTIMES = tuple(RUNTIME_MODULES)

# -- libedgetpu --------------------------------------------------------------------------
LIBEDGETPU_ENV = "SLURM_TPU_LIBEDGETPU"  # stands in for --libedgetpu
LIBEDGETPU_DEFAULT = "libedgetpu.so.1"  # the system's, found by the dynamic loader

# -- tasks: what a model's outputs mean (slurm_tpu/runner/tasks/) ----------------------------
AUTO = "auto"  # recognise the task from the model's outputs
DETECT, CLASSIFY, SEGMENT, RAW = "detect", "classify", "segment", "raw"
TASK_NAMES = (DETECT, CLASSIFY, SEGMENT, RAW)  # as listed to users (--task, serve's endpoints)

# -- where to run when the GPU cannot be set up ----------------------------------------------
FALLBACKS = (CPU,)

# -- batch results files ---------------------------------------------------------------------
JSONL, CSV = "jsonl", "csv"
RESULT_FORMATS = (JSONL, CSV)
