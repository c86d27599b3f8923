"""Image inputs of the bench's real models (``bench.models.cases``): crops of scikit-learn's sample photographs,
and captchas drawn on them as each captcha package's preprocessing presents them, with ddddocr's text
decoding for its task metric.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def photo_crops(samples: int, size: int, seed: int) -> np.ndarray:
    """(N, 3, size, size) float32 RGB in [0, 1] (YOLOv8's input, NCHW): square crops of scikit-learn's two
    sample photographs (china.jpg, flower.jpg, 427x640), the side 40-100 % of the short side at a random
    position, mirrored half the time, resized bilinearly to ``size``."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    crops = []
    for _ in range(samples):
        photo = photos[rng.integers(len(photos))]
        side = int(min(photo.shape[:2]) * rng.uniform(0.4, 1.0))
        top, left = (int(rng.integers(0, extent - side + 1)) for extent in photo.shape[:2])
        crop = photo[top : top + side, left : left + side]
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        crops.append(np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((size, size), Image.BILINEAR)))
    return (np.stack(crops).transpose(0, 3, 1, 2) / 255.0).astype(np.float32)


CAPTCHA_LETTERS = "abcdefghijkmnpqrstuvwxyz23456789ABCDEFGHJKLMNPQRSTUVWXYZ"  # no 0/O, 1/l/I


def _captcha_glyphs(
    rng: np.random.Generator, canvas, text: str, left: int, top: tuple[int, int], size: tuple[int, int], advance: int
) -> None:
    """Draw ``text`` on the PIL image ``canvas`` one rotated glyph at a time (Pillow's own scalable font,
    ``size`` px, dark random colours, -20 to 20 degrees), from ``left``, each glyph's top drawn from
    ``top``; the next glyph ``advance`` px on, plus up to 6."""
    from PIL import Image, ImageDraw, ImageFont

    for char in text:
        font = ImageFont.load_default(size=int(rng.integers(*size)))
        ink = Image.new("L", (int(size[1] * 1.3), int(size[1] * 1.4)), 0)
        ImageDraw.Draw(ink).text((6, 2), char, fill=255, font=font)
        ink = ink.rotate(float(rng.uniform(-20, 20)), resample=Image.BILINEAR)
        colour = Image.new("RGB", ink.size, tuple(int(v) for v in rng.integers(0, 120, 3)))
        canvas.paste(colour, (left, int(rng.integers(*top))), ink)
        left += advance + int(rng.integers(0, 7))


def _clutter(rng: np.random.Generator, canvas, lines: int, dots: int) -> None:
    """Captcha noise on ``canvas``: ``lines`` random strokes and ``dots`` random pixels."""
    from PIL import ImageDraw

    draw, (width, height) = ImageDraw.Draw(canvas), canvas.size
    for _ in range(lines):
        ends = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        draw.line(ends, fill=tuple(int(v) for v in rng.integers(0, 160, 3)), width=2)
    for _ in range(dots):
        point = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        draw.point(point, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))


def captcha_text_inputs(samples: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """ddddocr's text model inputs (N, 1, 64, 224) and the texts drawn: 4-6 letters and digits
    (``CAPTCHA_LETTERS``) on a light random background with noise strokes and dots, 64 px high (the
    height ddddocr resizes to), grey scale in [0, 1] as its ``OCREngine`` preprocessing makes it."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, texts = [], []
    for _ in range(samples):
        text = "".join(rng.choice(list(CAPTCHA_LETTERS), int(rng.integers(4, 7))))
        canvas = Image.new("RGB", (224, 64), tuple(int(v) for v in rng.integers(180, 256, 3)))
        _clutter(rng, canvas, lines=3, dots=0)
        _captcha_glyphs(rng, canvas, text, left=8, top=(0, 8), size=(34, 42), advance=28)
        _clutter(rng, canvas, lines=0, dots=150)
        images.append(np.asarray(canvas.convert("L"), np.float32)[None] / 255.0)
        texts.append(text)
    return np.stack(images), texts


def crnn_captcha_inputs(samples: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """captcha-whisperer's CRNN inputs (N, 3, 60, 160) and the texts drawn: 4-6 upper-case letters and
    digits (``CAPTCHA_LETTERS``' upper half) on a light random background with noise strokes and dots, as
    its ``preprocess`` presents an image: BGR, 0-255, unnormalised."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    letters = [c for c in CAPTCHA_LETTERS if not c.islower()]
    images, texts = [], []
    for _ in range(samples):
        text = "".join(rng.choice(letters, int(rng.integers(4, 7))))
        canvas = Image.new("RGB", (160, 60), tuple(int(v) for v in rng.integers(180, 256, 3)))
        _clutter(rng, canvas, lines=3, dots=0)
        _captcha_glyphs(rng, canvas, text, left=4, top=(0, 8), size=(28, 36), advance=22)
        _clutter(rng, canvas, lines=0, dots=100)
        images.append(np.asarray(canvas, np.float32)[..., ::-1].transpose(2, 0, 1))
        texts.append(text)
    return np.ascontiguousarray(np.stack(images)), texts


def captcha_scene_inputs(samples: int, seed: int) -> np.ndarray:
    """ddddocr's detector inputs (N, 3, 416, 416): a click captcha, 3-5 letters (``CAPTCHA_LETTERS``, 40-56
    px) scattered over a ``photo_crops`` photograph, as ddddocr's ``DetectionEngine`` preprocessing makes
    it: BGR, 0-255, unnormalised (its letterbox pads with 114; these scenes are square already)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    photos = photo_crops(samples, 416, seed)
    scenes = []
    for photo in photos:
        canvas = Image.fromarray((photo.transpose(1, 2, 0) * 255).astype(np.uint8))
        for char in rng.choice(list(CAPTCHA_LETTERS), int(rng.integers(3, 6))):
            at = (int(rng.integers(0, 340)), int(rng.integers(0, 340)))
            _captcha_glyphs(rng, canvas, str(char), left=at[0], top=(at[1], at[1] + 1), size=(40, 56), advance=0)
        scenes.append(np.asarray(canvas, np.float32)[..., ::-1].transpose(2, 0, 1))
    return np.ascontiguousarray(np.stack(scenes))


def _jigsaw(size: int):
    """A PIL ``L`` mask of a jigsaw piece: a square of 3/4 ``size`` with round tabs on its top and right."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", (size + size // 2, size + size // 2), 0)
    draw, side, corner, tab = ImageDraw.Draw(mask), size * 3 // 4, size // 4, size // 7
    draw.rectangle([corner, corner, corner + side, corner + side], fill=255)
    middle = corner + side // 2
    draw.ellipse([middle - tab, corner - tab - tab // 2, middle + tab, corner + tab - tab // 2], fill=255)
    draw.ellipse([corner + side - tab // 2, middle - tab, corner + side + tab + tab // 2, middle + tab], fill=255)
    return mask


def slider_inputs(samples: int, seed: int) -> np.ndarray:
    """captcha-recognizer's slider model inputs (N, 3, 640, 640): a ``photo_crops`` background at 320x160
    with a jigsaw-shaped gap (40-56 px, darkened by 40-60 %, outlined in white) right of x = 110 and the
    piece itself, outlined, at the left edge; letterboxed to 640 as its ``Slider.preprocess`` does
    (scaled 2x, grey 114 bars above and below), RGB in [0, 1]."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    images = []
    for photo in photo_crops(samples, 400, seed):
        background = Image.fromarray((photo.transpose(1, 2, 0) * 255).astype(np.uint8)).resize((320, 160))
        mask = _jigsaw(int(rng.integers(40, 56)))
        width, height = mask.size
        left, top = int(rng.integers(110, 320 - width)), int(rng.integers(5, 160 - height))
        piece = background.crop((left, top, left + width, top + height))
        shade = Image.new("RGB", mask.size, (0, 0, 0))
        background.paste(Image.blend(piece, shade, float(rng.uniform(0.4, 0.6))), (left, top), mask)
        outline, white = mask.filter(ImageFilter.FIND_EDGES), Image.new("RGB", mask.size, (255, 255, 255))
        background.paste(white, (left, top), outline)
        at = (int(rng.integers(2, 12)), top)
        background.paste(piece, at, mask)
        background.paste(white, at, outline)
        canvas = Image.new("RGB", (640, 640), (114, 114, 114))
        canvas.paste(background.resize((640, 320), Image.BILINEAR), (0, 160))
        images.append(np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0)
    return np.stack(images)


def ctc_texts(outputs: list[np.ndarray], charset: list[str], blank: int = 0) -> list[str]:
    """Greedy CTC decoding of a captcha text model's outputs, (T, N, classes) per batch, as ddddocr's
    ``OCREngine`` decodes: argmax per step, repeats merged, class ``blank`` dropped (ddddocr: 0;
    captcha-whisperer: its last class)."""
    texts = []
    for output in outputs:
        for steps in np.argmax(output, axis=-1).T:  # (N, T)
            kept = [int(k) for i, k in enumerate(steps) if k != blank and (i == 0 or k != steps[i - 1])]
            texts.append("".join(charset[k] for k in kept))
    return texts


def ddddocr_charset(root: Path) -> list[str]:
    """The classes of ddddocr's ``common.onnx`` (its ``CHARSET_BETA``), read as data from the wheel."""
    import ast

    tree = ast.parse((root / "ddddocr" / "charsets.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CHARSET_BETA" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError("ddddocr/charsets.py has no CHARSET_BETA")


def text_accuracy(outputs: list[np.ndarray], charset: list[str], truth: list[str], blank: int = 0) -> float:
    """Share of ``truth`` texts that ``outputs`` read exactly, case aside (as captcha checks compare)."""
    read = ctc_texts(outputs, charset, blank)
    return float(np.mean([a.lower() == b.lower() for a, b in zip(read, truth, strict=True)]))
