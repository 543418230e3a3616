"""Turn an input file into the model's input tensor: images (Pillow) and .npy arrays.

Images are prepared the way pycoral's examples do it, so that scores match Coral's
documented ones bit for bit: ``classify_image.py`` stretches the fully decoded image to
the input with LANCZOS (``ANTIALIAS``); ``detect_image.py`` (``keep_aspect=True``) uses
``common.set_resized_input``: scale to fit (``scale = min(W / w, H / h)``, sizes
truncated with ``int``), LANCZOS, paste at the top-left of a zero tensor; the scale maps
boxes back. ``fast=True`` (``--fast-resize``, opt-in) decodes JPEGs at a reduced scale
(Pillow's draft mode) and resizes with BILINEAR, which changes the tensor.

Pixel values (uint8 models, as classify_image.py): without ``--input-mean``/``--input-std``
the raw pixels go in (the model's input quantization is trusted to encode the
normalisation, true of Coral's models); with them, pycoral's formula exactly: raw pixels
when ``scale * std == 1`` and ``mean == zero_point``, else ``(p - mean) / (std * scale) +
zero_point``, clipped to [0, 255] and truncated to uint8. int8 models get ``p - 128``;
float models ``(p - mean) / std`` (default mean = std = 127.5, i.e. [-1, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from .errors import InputError
from .modelinfo import TensorSpec

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm"})
NPY_SUFFIX = ".npy"
_PYCORAL_TOLERANCE = 1e-5  # classify_image.py's test for "input needs no preprocessing"


@dataclass(frozen=True)
class Normalization:
    mean: float | None = None
    std: float | None = None


@dataclass(frozen=True)
class Resize:
    """How an image becomes the input's size."""

    keep_aspect: bool = False  # pycoral's set_resized_input: fit, pad right/bottom with zeros
    fast: bool = False  # JPEG draft decoding + BILINEAR (changes the tensor: opt-in)


@dataclass(frozen=True)
class Geometry:
    """Where the source image went in the input tensor: what post-processing needs to map
    results back (boxes, masks). All sizes are (width, height)."""

    input: tuple[int, int] | None = None  # the input tensor's; None: not an image input
    size: tuple[int, int] | None = None  # the source image's (a .npy: the input's)
    scale: tuple[float, float] = (1.0, 1.0)  # pycoral's resize ratio (x, y): input px per source px
    resized: tuple[int, int] | None = None  # the image inside the input tensor (less when padded)


@dataclass(frozen=True)
class Prepared:
    """An input tensor and the geometry of its source."""

    tensor: np.ndarray  # [1, H, W, C] (or the .npy's shape)
    geometry: Geometry = Geometry()


def is_input_file(path: str) -> bool:
    suffix = Path(path).suffix.lower()
    return suffix in IMAGE_SUFFIXES or suffix == NPY_SUFFIX


def pixels_to_tensor(pixels: np.ndarray, spec: TensorSpec, norm: Normalization = Normalization()) -> np.ndarray:
    """[H, W, C] uint8 pixels -> [1, H, W, C] tensor of the spec's dtype."""
    explicit = norm.mean is not None or norm.std is not None
    if spec.dtype == np.uint8:
        if not explicit:
            return pixels[np.newaxis]
        mean = 128.0 if norm.mean is None else norm.mean  # classify_image.py's defaults
        std = 128.0 if norm.std is None else norm.std
        scale, zero = (spec.scale, spec.zero_point) if spec.quantized else (1.0, 0)
        if abs(scale * std - 1) < _PYCORAL_TOLERANCE and abs(mean - zero) < _PYCORAL_TOLERANCE:
            return pixels[np.newaxis]
        normalized = (pixels - mean) / (std * scale) + zero  # float64, as numpy does it in pycoral
        np.clip(normalized, 0, 255, out=normalized)
        return normalized.astype(np.uint8)[np.newaxis]
    if spec.dtype == np.int8 and not explicit:
        return (pixels.astype(np.int16) - 128).astype(np.int8)[np.newaxis]
    mean = 127.5 if norm.mean is None else norm.mean
    std = 127.5 if norm.std is None else norm.std
    real = (pixels.astype(np.float32) - mean) / std
    if spec.quantized:
        info = np.iinfo(spec.dtype)
        q = np.round(real / spec.scale + spec.zero_point)
        return np.clip(q, info.min, info.max).astype(spec.dtype)[np.newaxis]
    return real.astype(spec.dtype)[np.newaxis]


def fitted_size(source: tuple[int, int], target: tuple[int, int]) -> tuple[tuple[int, int], float]:
    """set_resized_input's arithmetic: the (width, height) a ``source`` image is scaled to
    inside a ``target`` input keeping its aspect ratio, and the scale."""
    scale = min(target[0] / source[0], target[1] / source[1])
    # At least one pixel: a 1000x1 strip would otherwise resize to nothing (pycoral fails there).
    return (max(1, int(source[0] * scale)), max(1, int(source[1] * scale))), scale


def _decode(
    path: str | BinaryIO, mode: str, draft: Callable[[tuple[int, int]], tuple[int, int]] | None, name: str | None = None
):
    """The image at ``path`` (or in a file object, called ``name`` in errors) in ``mode``
    and its original (width, height). ``draft`` (fast path only) gives, from the original
    size, the size the image will be resized to."""
    from PIL import Image, UnidentifiedImageError

    path_name = name or str(path)
    try:
        with Image.open(path) as image:
            size = image.size
            if draft is not None:
                # JPEG can decode straight at a reduced scale: much cheaper for big photos.
                image.draft(mode, draft(size))
            return image.convert(mode), size
    except FileNotFoundError:
        raise InputError(f"input {path_name} does not exist", path_name) from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"input {path_name} is not a readable image ({type(exc).__name__})", path_name) from None


def load_image(
    path: str | BinaryIO,
    spec: TensorSpec,
    norm: Normalization = Normalization(),
    resize: Resize = Resize(),
    name: str | None = None,
) -> Prepared:
    """Decode, convert and resize an image file (or file object, called ``name`` in
    errors) to the model's input (see the module doc)."""
    if len(spec.shape) != 4 or spec.shape[3] not in (1, 3):
        raise InputError(
            f"model input '{spec.name}' has shape {spec.shape}, not an NHWC image: give .npy inputs instead", spec.name
        )
    height, width, channels = spec.shape[1:]
    target = (width, height)

    def fit(size: tuple[int, int]) -> tuple[int, int]:  # the (width, height) the image is resized to
        return fitted_size(size, target)[0] if resize.keep_aspect else target

    from PIL import Image

    image, size = _decode(path, "RGB" if channels == 3 else "L", fit if resize.fast else None, name)
    (w, h), scale = fitted_size(size, target) if resize.keep_aspect else (target, 1.0)
    if image.size != (w, h):
        # Image.Resampling needs Pillow 9.1; the module-level names are set by a loop mypy cannot follow.
        image = image.resize((w, h), Image.BILINEAR if resize.fast else Image.LANCZOS)  # type: ignore[attr-defined]
    pixels = np.asarray(image, dtype=np.uint8).reshape(h, w, channels)
    if not resize.keep_aspect:
        return Prepared(
            pixels_to_tensor(pixels, spec, norm), Geometry(target, size, (w / size[0], h / size[1]), target)
        )
    tensor = np.zeros(spec.shape, dtype=spec.dtype)  # set_resized_input: tensor.fill(0), then paste
    tensor[0, :h, :w] = pixels_to_tensor(pixels, spec, norm)[0]
    return Prepared(tensor, Geometry(target, size, (scale, scale), (w, h)))


def conform_array(array: np.ndarray, spec: TensorSpec, name: str) -> np.ndarray:
    """An array as the model's input, as .npy inputs are taken: the batch dimension may be
    omitted; float arrays are quantized for quantized models (errors name ``name``)."""
    if array.shape == tuple(spec.shape[1:]):
        array = array[np.newaxis]
    if array.shape != tuple(spec.shape):
        raise InputError(f"input {name} has shape {array.shape}, the model wants {tuple(spec.shape)}", name)
    if array.dtype == spec.dtype:
        return array
    if np.issubdtype(array.dtype, np.floating) and spec.quantized:
        info = np.iinfo(spec.dtype)
        return np.clip(np.round(array / spec.scale + spec.zero_point), info.min, info.max).astype(spec.dtype)
    if np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
        return array.astype(spec.dtype)
    raise InputError(f"input {name} has dtype {array.dtype}, the model wants {spec.dtype}", name)


def as_input(tensor: np.ndarray, spec: TensorSpec) -> Prepared:
    """An array taken as the input tensor itself: its "image" is the input, at scale 1."""
    size = (spec.shape[2], spec.shape[1]) if len(spec.shape) == 4 else None
    return Prepared(tensor, Geometry(size, size, (1.0, 1.0), size))


def load_input(
    path: str, spec: TensorSpec, norm: Normalization = Normalization(), resize: Resize = Resize()
) -> Prepared:
    """The prepared input for one file, by its suffix (a .npy array: :func:`conform_array`, :func:`as_input`)."""
    if path.lower().endswith(NPY_SUFFIX):
        try:
            array = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"input {path} does not exist", path) from None
        except (OSError, ValueError) as exc:
            raise InputError(f"input {path} is not a readable .npy file ({exc})", path) from None
        return as_input(conform_array(array, spec, path), spec)
    return load_image(path, spec, norm, resize)
