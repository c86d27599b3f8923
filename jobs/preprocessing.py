"""How images become a model input: the recipe's `preprocessing` section, and whether its output fits.

The worker applies the steps in this order to every image (`worker.images`):

    decode → convert to RGB (or L for gray) → resize → center crop → channel order
           → x[c] = (pixel[c] · scale - mean[c]) / std[c] → layout (NCHW | NHWC) → dtype

`resize` as one integer scales the shorter side to it (aspect kept); as [height, width] it sets both.
The output size must be known before any image is read, so either `center_crop` or a two-value
`resize` is required: the job's shape check (`preprocessing_mismatches`) runs at `POST /jobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from jobs.dataset_fit import LABELS, dataset_mismatches
from jobs.models import Dataset, DatasetKind
from jobs.recipe_methods import qat_data_problems

if TYPE_CHECKING:
    from jobs.recipe import Recipe

Side = Annotated[int, Field(ge=1, le=4096)]  # pixels
Size = Side | tuple[Side, Side]
ITEM_BYTES = {"float32": 4, "float16": 2, "uint8": 1}


class PreprocessingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str | None = Field(
        None, min_length=1, max_length=256, description="The model input the images feed; default: its only input."
    )
    resize: Size | None = Field(
        None,
        description="One integer: the shorter side becomes this many pixels (aspect kept). [height, width]: both "
        "set. Bilinear. Omitted: images keep their size.",
    )
    center_crop: Size | None = Field(
        None, description="Crop the centre to this size (one integer: a square) after resizing."
    )
    channel_order: Literal["rgb", "bgr", "gray"] = Field(
        "rgb", description="rgb or bgr: 3 channels in that order; gray: 1 channel (ITU-R 601-2 luma)."
    )
    scale: float = Field(1 / 255, gt=0.0, le=1.0, description="Pixel values (0-255) are multiplied by this first.")
    mean: list[float] | None = Field(
        None, min_length=1, max_length=3, description="Per channel, subtracted after scaling; default 0."
    )
    std: list[float] | None = Field(
        None, min_length=1, max_length=3, description="Per channel, divides after the mean; default 1."
    )
    layout: Literal["nchw", "nhwc"] = Field("nchw", description="Axis order of the model input.")
    dtype: Literal["float32", "float16", "uint8"] = Field(
        "float32", description="Element type of the model input. uint8 takes raw pixels (scale 1, no mean/std)."
    )

    @field_validator("mean", "std")
    @classmethod
    def _one_per_channel(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if value is None:
            return value
        channels = 1 if info.data.get("channel_order") == "gray" else 3
        if len(value) != channels:
            raise ValueError(f"needs {channels} value(s), one per channel of channel_order")
        if info.field_name == "std" and any(v <= 0 for v in value):
            raise ValueError("every std must be positive")
        return value

    @field_validator("dtype")
    @classmethod
    def _raw_pixels_for_integers(cls, value: str, info: ValidationInfo) -> str:
        raw = info.data.get("scale") == 1 and not info.data.get("mean") and not info.data.get("std")
        if value == "uint8" and not raw:
            raise ValueError("uint8 takes raw pixels: set scale to 1 and leave mean and std out")
        return value

    @model_validator(mode="after")
    def _size_is_known(self) -> PreprocessingSpec:
        if self.center_crop is None and not isinstance(self.resize, tuple):
            raise ValueError(
                "the input size must not depend on the image: set center_crop, or resize as [height, width]"
            )
        return self

    @property
    def channels(self) -> int:
        return 1 if self.channel_order == "gray" else 3

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of every preprocessed image."""
        final = self.center_crop if self.center_crop is not None else self.resize
        assert final is not None  # _size_is_known
        return (final, final) if isinstance(final, int) else final

    def sample_shape(self) -> list[int]:
        height, width = self.size
        return [self.channels, height, width] if self.layout == "nchw" else [height, width, self.channels]


def preprocessing_mismatches(
    model_info: dict[str, Any], spec: PreprocessingSpec | None, num_samples: int
) -> list[tuple[str, str]]:
    """(field, reason) pairs why preprocessed images cannot feed the model; empty when they fit."""
    field = "recipe.preprocessing"
    if spec is None:
        return [(field, "an image dataset needs a preprocessing section (size, channel order, mean/std, layout)")]
    inputs = [i["name"] for i in model_info.get("inputs", [])]
    name = spec.input
    if name is None:
        if len(inputs) != 1:
            return [(f"{field}.input", f"the model has inputs {inputs}: name the one the images feed")]
        name = inputs[0]
    elif name not in inputs:
        return [(f"{field}.input", f"the model has no input '{name}' (inputs: {inputs})")]
    others = [i for i in inputs if i != name]
    if others:
        return [(f"{field}.input", f"an image dataset feeds one input; the model also needs {others}")]
    produced = [{"name": name, "dtype": spec.dtype, "shape": [num_samples, *spec.sample_shape()]}]
    described = f"images preprocessed to {spec.dtype} {spec.sample_shape()} ({spec.layout})"
    return [(field, f"{described} do not fit: {p}") for p in dataset_mismatches(model_info, produced)]


def decoded_bytes(spec: PreprocessingSpec, num_images: int) -> int:
    """Bytes the worker holds once `num_images` images are preprocessed (one array per split)."""
    height, width = spec.size
    return num_images * spec.channels * height * width * ITEM_BYTES[spec.dtype]


def _qat_data(model_info: dict[str, Any], dataset: Dataset, spec: PreprocessingSpec | None) -> dict[str, Any]:
    """``qat_data_problems``' view of the data: whether it has labels, and each model input's (dtype, shape of
    one sample): the preprocessed image's, or the array's past its first axis."""
    inputs = [i["name"] for i in model_info.get("inputs", [])]
    if dataset.kind == DatasetKind.images:
        has_labels = (dataset.images or {}).get("label_source") is not None
        name = spec.input if spec is not None and spec.input else inputs[0] if len(inputs) == 1 else None
        samples = {} if spec is None or name is None else {name: (spec.dtype, spec.sample_shape())}
        return {"has_labels": has_labels, "samples": samples}
    arrays = {a["name"]: a for a in dataset.arrays}
    samples = {name: (arrays[name]["dtype"], arrays[name]["shape"][1:]) for name in inputs if name in arrays}
    return {"has_labels": LABELS in arrays and LABELS not in inputs, "samples": samples}


def job_input_mismatches(
    model_info: dict[str, Any], *, dataset: Dataset, recipe: Recipe, max_decoded_bytes: int
) -> list[tuple[str, str]]:
    """(field, reason) pairs why a job's data cannot feed the model: arrays checked by name, images
    through the preprocessing they will get, the decoded images against the worker's memory cap, and the
    calibration samples against one QAT training batch, its label loss and augmentation."""
    preprocessing = recipe.preprocessing
    shortfall = recipe.qat_shortfall(dataset.num_samples or 0)
    qat = [] if shortfall is None else [("recipe.qat.batch_size", shortfall)]
    if recipe.qat is not None:
        qat += qat_data_problems(recipe.qat, **_qat_data(model_info, dataset, preprocessing))
    if dataset.kind == DatasetKind.images:
        problems = preprocessing_mismatches(model_info, preprocessing, dataset.num_samples)
        if preprocessing is not None and not problems:
            num_calibration, num_eval = recipe.split_sizes(dataset.num_samples)
            need = decoded_bytes(preprocessing, num_calibration + num_eval)
            if need > max_decoded_bytes:
                problems.append(
                    (
                        "recipe.calibration.num_samples",
                        f"{num_calibration} calibration + {num_eval} evaluation images decode to {need} bytes, more "
                        f"than the {max_decoded_bytes} a worker holds: lower calibration.num_samples or "
                        "evaluation.max_samples",
                    )
                )
        return problems + qat
    problems = [("dataset_id", p) for p in dataset_mismatches(model_info, dataset.arrays)]
    if preprocessing is not None:
        problems.append(("recipe.preprocessing", "applies to image datasets only; this dataset is an .npz of arrays"))
    return problems + qat
