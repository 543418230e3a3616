"""Turn an input file into the model's input tensor: images (Pillow) and .npy arrays.

Image convention (as pycoral's classify_image.py): a uint8 model whose input
quantization already encodes the normalisation gets the raw pixels; with an explicit
mean/std, pixels become ``(p - mean) / (std * scale) + zero_point``. int8 models get
``p - 128``; float models ``(p - mean) / std`` (default mean = std = 127.5, i.e. [-1, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError
from .spec import TensorSpec

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm"})
NPY_SUFFIX = ".npy"


@dataclass(frozen=True)
class Normalization:
    mean: float | None = None
    std: float | None = None


def is_input_file(path: str) -> bool:
    suffix = Path(path).suffix.lower()
    return suffix in IMAGE_SUFFIXES or suffix == NPY_SUFFIX


def image_size(spec: TensorSpec) -> tuple[int, int, int]:
    """(height, width, channels) of an NHWC image input."""
    if len(spec.shape) != 4 or spec.shape[3] not in (1, 3):
        raise InputError(f"model input '{spec.name}' has shape {spec.shape}, not an NHWC image: "
                         "give .npy inputs instead", spec.name)
    return spec.shape[1], spec.shape[2], spec.shape[3]


def pixels_to_tensor(pixels: np.ndarray, spec: TensorSpec, norm: Normalization = Normalization()) -> np.ndarray:
    """[H, W, C] uint8 pixels -> [1, H, W, C] tensor of the spec's dtype."""
    if spec.dtype == np.uint8 and norm.mean is None and norm.std is None:
        return pixels[np.newaxis]
    if spec.dtype == np.int8 and norm.mean is None and norm.std is None:
        return (pixels.astype(np.int16) - 128).astype(np.int8)[np.newaxis]
    mean = 127.5 if norm.mean is None else norm.mean
    std = 127.5 if norm.std is None else norm.std
    real = (pixels.astype(np.float32) - mean) / std
    if spec.quantized:
        info = np.iinfo(spec.dtype)
        q = np.round(real / spec.scale + spec.zero_point)
        return np.clip(q, info.min, info.max).astype(spec.dtype)[np.newaxis]
    return real.astype(spec.dtype)[np.newaxis]


def load_image(path: str, spec: TensorSpec, norm: Normalization = Normalization()) -> np.ndarray:
    """Decode, convert and resize an image file to the model's input."""
    from PIL import Image, UnidentifiedImageError

    height, width, channels = image_size(spec)
    try:
        with Image.open(path) as image:
            # JPEG can decode straight at a reduced scale: much cheaper for big photos.
            image.draft("RGB" if channels == 3 else "L", (width, height))
            image = image.convert("RGB" if channels == 3 else "L")
            if image.size != (width, height):
                image = image.resize((width, height), Image.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise InputError(f"input {path} does not exist", path) from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"input {path} is not a readable image ({type(exc).__name__})", path) from None
    if channels == 1:
        pixels = pixels[:, :, np.newaxis]
    return pixels_to_tensor(pixels, spec, norm)


def load_npy(path: str, spec: TensorSpec) -> np.ndarray:
    """A .npy array as the model's input: the batch dimension may be omitted; float
    arrays are quantized for quantized models."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input {path} does not exist", path) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"input {path} is not a readable .npy file ({exc})", path) from None
    if array.shape == tuple(spec.shape[1:]):
        array = array[np.newaxis]
    if array.shape != tuple(spec.shape):
        raise InputError(f"input {path} has shape {array.shape}, the model wants {tuple(spec.shape)}", path)
    if array.dtype == spec.dtype:
        return array
    if np.issubdtype(array.dtype, np.floating) and spec.quantized:
        info = np.iinfo(spec.dtype)
        return np.clip(np.round(array / spec.scale + spec.zero_point), info.min, info.max).astype(spec.dtype)
    if np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
        return array.astype(spec.dtype)
    raise InputError(f"input {path} has dtype {array.dtype}, the model wants {spec.dtype}", path)


def load_input(path: str, spec: TensorSpec, norm: Normalization = Normalization()) -> np.ndarray:
    """The tensor for one input file, by its suffix."""
    if path.lower().endswith(NPY_SUFFIX):
        return load_npy(path, spec)
    return load_image(path, spec, norm)
