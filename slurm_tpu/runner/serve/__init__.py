"""``slurm-tpu serve``: models held open on a job's devices behind a TF Serving-style REST API.

One concern per module:

- ``models``       which models, under which names and tasks; request bytes to tensors
- ``devicequeue``  one bounded queue, one worker per device (never two inferences on a TPU)
- ``codec``        TF Serving's JSON (status, metadata, predict) and the task endpoints' bodies
- ``app``          the endpoints and limits, apart from HTTP
- ``httpserver``   HTTP/1.1 (standard library): token, body limits, connection cap, drain
- ``auth``         the per-job token and the private address file
- ``metrics``      /metrics in Prometheus' text format
- ``server``       open, listen, publish, stop gracefully on SIGTERM
- ``client``       ``slurm-tpu infer --server``
"""
