"""Container images for the tests and the demo, built offline (issue 34).

- :mod:`harness.containers.image`: a small Debian bookworm image (``mmdebstrap`` minbase +
  python3 + the tflite runtime the suite uses, ai-edge-litert and numpy, + Coral's example
  code the demo runs), cached under ``/var/cache/slurm-tpu/containers/`` by its inputs, as
  a root filesystem tarball (``podman import``) and a squashfs (enroot's format). No registry.
"""
