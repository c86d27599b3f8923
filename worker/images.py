"""Decode the images of an image-zip dataset and turn them into the model's input array.

Decoding happens here, in the worker, never in the API: Pillow parses untrusted bytes. Each image's
pixel count is read from its header and checked against `max_image_pixels` before any pixel is
decoded (a 100 kB PNG can declare 60000 x 60000 pixels), and reads from the archive are bounded by
the member's declared size (`jobs.archives` capped it). Every error names the member.

The steps and the formula are documented on `jobs.preprocessing.PreprocessingSpec`; they are pure
functions of the image bytes and the spec, so a job re-run produces bit-identical inputs.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from jobs.preprocessing import PreprocessingSpec
from quantcore.errors import InvalidDataError

_FORMATS = {"JPEG", "PNG"}
# Pillow raises these for truncated or malformed data (and DecompressionBombError, an Exception subclass).
_DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def _open(archive: zipfile.ZipFile, name: str, *, max_pixels: int) -> Image.Image:
    """Decode one member fully; raises `InvalidDataError` naming it when it is not a sound JPEG/PNG."""
    try:
        with archive.open(name) as handle:
            image = Image.open(handle, formats=sorted(_FORMATS))
            width, height = image.size
            if width * height > max_pixels:
                raise InvalidDataError(
                    f"image '{name}' declares {width}x{height} pixels; at most {max_pixels} pixels are accepted"
                )
            image.load()  # decode every pixel now: a truncated file fails here, not halfway through a job
            return image
    except InvalidDataError:
        raise
    except (*_DECODE_ERRORS, zipfile.BadZipFile) as exc:
        raise InvalidDataError(f"image '{name}' cannot be decoded: {exc}") from exc


def verify_images(path: Path, files: Sequence[str], *, max_pixels: int) -> None:
    """Decode every image once (the dataset's validation task); the first bad one raises, named."""
    with zipfile.ZipFile(path) as archive:
        for name in files:
            _open(archive, name, max_pixels=max_pixels).close()


def _resize(image: Image.Image, spec: PreprocessingSpec) -> Image.Image:
    if spec.resize is None:
        return image
    if isinstance(spec.resize, int):  # shorter side → resize, aspect kept
        width, height = image.size
        short = min(width, height)
        size = (round(width * spec.resize / short), round(height * spec.resize / short))
    else:
        height, width = spec.resize
        size = (width, height)
    return image.resize(size, Image.Resampling.BILINEAR)


def _center_crop(image: Image.Image, spec: PreprocessingSpec, name: str) -> Image.Image:
    if spec.center_crop is None:
        return image
    height, width = spec.size
    have_w, have_h = image.size
    if have_w < width or have_h < height:
        raise InvalidDataError(
            f"image '{name}' is {have_w}x{have_h} after resizing, smaller than the {width}x{height} center_crop"
        )
    left, top = round((have_w - width) / 2), round((have_h - height) / 2)
    return image.crop((left, top, left + width, top + height))


def preprocess(image: Image.Image, spec: PreprocessingSpec, name: str) -> np.ndarray:
    """One image → one sample of shape `spec.sample_shape()` and dtype `spec.dtype`."""
    image = image.convert("L" if spec.channel_order == "gray" else "RGB")
    image = _center_crop(_resize(image, spec), spec, name)
    if image.size != spec.size[::-1]:
        width, height = image.size
        raise InvalidDataError(
            f"image '{name}' is {width}x{height} after preprocessing, not the {spec.size[1]}x{spec.size[0]} "
            "the recipe states: give resize as [height, width] or a center_crop"
        )
    pixels = np.asarray(image)  # (H, W, 3) uint8, or (H, W) for gray
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    if spec.channel_order == "bgr":
        pixels = pixels[:, :, ::-1]
    if spec.dtype == "uint8":
        sample = pixels
    else:
        mean = np.asarray(spec.mean or [0.0] * spec.channels, np.float32)  # (C,)
        std = np.asarray(spec.std or [1.0] * spec.channels, np.float32)  # (C,)
        sample = (pixels.astype(np.float32) * np.float32(spec.scale) - mean) / std
    if spec.layout == "nchw":
        sample = sample.transpose(2, 0, 1)  # (H, W, C) → (C, H, W)
    return np.ascontiguousarray(sample, dtype=spec.dtype)


def load_images(
    path: Path,
    files: Sequence[str],
    spec: PreprocessingSpec,
    *,
    max_pixels: int,
    should_stop: Callable[[], object] = lambda: None,
) -> np.ndarray:
    """(N, *spec.sample_shape()) for the named members, in the given order. `should_stop` is called
    once per image so a cancel request is noticed during a long decode."""
    batch = np.empty((len(files), *spec.sample_shape()), dtype=spec.dtype)
    with zipfile.ZipFile(path) as archive:
        for i, name in enumerate(files):
            should_stop()
            with _open(archive, name, max_pixels=max_pixels) as image:
                batch[i] = preprocess(image, spec, name)
    return batch
