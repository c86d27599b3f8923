"""The recipe's ``qat`` section (pure pydantic: the API answers its errors with 422 problem+json naming the
field), its translation into ``QatConfig``, and ``QatConfig``'s own bounds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobs.models import Dataset, DatasetKind
from jobs.preprocessing import job_input_mismatches
from jobs.recipe import Recipe
from quantcore import QuantizeConfig
from quantcore.config import AccuracyTarget, QatAugment, QatConfig
from worker.translate import to_quantize_config


def error_of(recipe: dict) -> tuple[str, str]:
    """(dotted location, message) of the single validation error ``recipe`` raises."""
    with pytest.raises(ValidationError) as raised:
        Recipe.model_validate(recipe)
    errors = raised.value.errors()
    assert len(errors) == 1, errors
    return ".".join(str(p) for p in errors[0]["loc"]), errors[0]["msg"]


@pytest.mark.parametrize(
    ("qat", "extra", "field", "needle"),
    [
        ({"epochs": 0}, {}, "qat.epochs", "greater than or equal to 1"),
        ({"epochs": 1001}, {}, "qat.epochs", "less than or equal to 1000"),
        ({"lr": 0}, {}, "qat.lr", "greater than 0"),
        ({"lr": 2}, {}, "qat.lr", "less than or equal to 1"),
        ({"steps": 0}, {}, "qat.steps", "greater than or equal to 1"),
        ({"holdout": 0.9}, {}, "qat.holdout", "less than or equal to 0.5"),
        ({"loss": "ce"}, {}, "qat.loss", "'mse' or 'kl'"),
        ({"learn_scales": "maybe"}, {}, "qat.learn_scales", "valid boolean"),
        ({"freeze_bn_after": 3}, {}, "qat.freeze_bn_after", "Extra inputs"),  # BN is folded before QAT
        ({"label_weight": -1}, {}, "qat.label_weight", "greater than or equal to 0"),
        ({"augment": {"crop_padding": 65}}, {}, "qat.augment.crop_padding", "less than or equal to 64"),
        ({"augment": {"rotate": True}}, {}, "qat.augment.rotate", "Extra inputs"),
        ({"intermediate": ["t"] * 65}, {}, "qat.intermediate", "at most 64 items"),
        # the search holds calibration samples out for its selection, and carries no labels to training
        ({"label_weight": 1}, {"strategy": "auto"}, "strategy", "cannot be combined with qat.label_weight"),
        # 64 calibration samples, 13 held out: 51 left for training, fewer than one batch of 64
        ({"batch_size": 64}, {"calibration": {"num_samples": 64}}, "qat", "qat.batch_size 64 exceeds the 51"),
        ({}, {"target": {"metric": "sqnr", "threshold": 30}}, "qat", "cannot be combined with a target"),
        ({}, {"platform": "onnxruntime-weight-only"}, "", "qat do not apply"),
    ],
)
def test_invalid_qat_recipes_name_the_field(qat: dict, extra: dict, field: str, needle: str) -> None:
    location, message = error_of({**extra, "qat": qat})
    assert location == field and needle in message, (location, message)


def test_qat_translates_with_its_seed_or_the_recipe_seed() -> None:
    recipe = {"platform": "academic", "precision": "w4a4", "seed": 7}
    spec = {"epochs": 3, "steps": 50, "lr": 3e-4, "batch_size": 16, "loss": "kl", "learn_scales": False}
    config = to_quantize_config(Recipe.model_validate({**recipe, "qat": spec})).qat
    assert (config.epochs, config.steps, config.lr, config.batch_size) == (3, 50, 3e-4, 16)
    assert (config.loss, config.learn_scales, config.seed) == ("kl", False, 7)
    assert to_quantize_config(Recipe.model_validate({**recipe, "qat": {**spec, "seed": 2}})).qat.seed == 2
    assert to_quantize_config(Recipe.model_validate(recipe)).qat is None


def test_qat_label_loss_augmentation_and_intermediate_tensors_translate() -> None:
    spec = {"label_weight": 0.5, "augment": {"flip": True, "crop_padding": 2}, "intermediate": ["a", "b"]}
    config = to_quantize_config(Recipe.model_validate({"qat": spec})).qat
    assert (config.label_weight, config.augment, config.intermediate) == (0.5, QatAugment(True, 2), ("a", "b"))
    assert config.to_dict()["augment"] == {"flip": True, "crop_padding": 2}  # the report's qat section
    default = to_quantize_config(Recipe.model_validate({"qat": {}})).qat
    assert (default.label_weight, default.augment, default.intermediate) == (0.0, None, ())


@pytest.mark.parametrize(
    ("field", "value"),
    [("epochs", 0), ("steps", 0), ("lr", 0.0), ("lr", float("nan")), ("holdout", 0.6), ("loss", "ce"), ("seed", -1)],
)
def test_qat_config_refuses_bad_values_by_name(field, value) -> None:
    with pytest.raises(ValueError, match=f"qat.{field}"):
        QatConfig(**{field: value})


def test_qat_is_refused_with_a_target_and_on_the_weight_only_platform() -> None:
    with pytest.raises(ValueError, match="qat and target"):
        QuantizeConfig(qat=QatConfig(), target=AccuracyTarget("cosine", 0.99))
    with pytest.raises(ValueError, match="qat is not available"):
        QuantizeConfig(platform="onnxruntime-weight-only", qat=QatConfig())


def test_a_dataset_too_small_for_one_qat_batch_is_refused_naming_the_field() -> None:
    """The recipe alone passes (512 calibration samples by default); the dataset is known at job creation:
    40 samples, 8 held out for evaluation, 32 calibrate, of which 6 are held out for QAT: 26 < 32."""
    info = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4], "batch_axis": 0}]}
    recipe = Recipe.model_validate({"platform": "academic", "precision": "w4a4", "qat": {"batch_size": 32}})

    def mismatches(samples: int) -> list[tuple[str, str]]:
        arrays = [{"name": "x", "dtype": "float32", "shape": [samples, 4]}]
        dataset = Dataset(kind=DatasetKind.arrays, num_samples=samples, arrays=arrays)
        return job_input_mismatches(info, dataset=dataset, recipe=recipe, max_decoded_bytes=2**30)

    [(field, message)] = mismatches(40)
    assert field == "recipe.qat.batch_size" and "exceeds the 26 training samples left of 32" in message
    assert mismatches(400) == []


def array_mismatches(qat: dict, arrays: list[dict], shape: list) -> list[tuple[str, str]]:
    """job_input_mismatches for a model input x of ``shape`` (batch first) fed by ``arrays`` of 400 samples."""
    info = {"inputs": [{"name": "x", "dtype": "float32", "shape": shape, "batch_axis": 0}]}
    recipe = Recipe.model_validate({"platform": "academic", "precision": "w4a4", "qat": qat})
    dataset = Dataset(kind=DatasetKind.arrays, num_samples=400, arrays=arrays)
    return job_input_mismatches(info, dataset=dataset, recipe=recipe, max_decoded_bytes=2**30)


def test_a_label_loss_on_a_dataset_without_labels_is_refused_naming_the_field() -> None:
    images = {"name": "x", "dtype": "float32", "shape": [400, 3, 8, 8]}
    labels = {"name": "labels", "dtype": "int64", "shape": [400]}
    [(field, message)] = array_mismatches({"label_weight": 1.0}, [images], ["batch", 3, 8, 8])
    assert field == "recipe.qat.label_weight" and "needs a dataset with labels" in message
    assert array_mismatches({"label_weight": 1.0}, [images, labels], ["batch", 3, 8, 8]) == []


def test_augmentation_of_inputs_that_are_not_images_is_refused_naming_the_field() -> None:
    features = {"name": "x", "dtype": "float32", "shape": [400, 16]}
    [(field, message)] = array_mismatches({"augment": {"flip": True}}, [features], ["batch", 16])
    assert field == "recipe.qat.augment" and "input 'x' takes float32 [16] per sample" in message
    nhwc = {"name": "x", "dtype": "float32", "shape": [400, 8, 8, 3]}
    [(field, _)] = array_mismatches({"augment": {"crop_padding": 1}}, [nhwc], ["batch", 8, 8, 3])
    assert field == "recipe.qat.augment"  # 8 "channels": an NHWC layout, not flipped along the wrong axis
    nchw = {"name": "x", "dtype": "float32", "shape": [400, 3, 8, 8]}
    assert array_mismatches({"augment": {"flip": True}}, [nchw], ["batch", 3, 8, 8]) == []
    assert array_mismatches({"augment": {}}, [features], ["batch", 16]) == []  # nothing to apply: accepted


def test_image_datasets_serve_a_label_loss_by_their_labels_and_are_augmented_in_nchw() -> None:
    info = {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 8, 8], "batch_axis": 0}]}

    def mismatches(qat: dict, label_source: str | None) -> list[tuple[str, str]]:
        recipe = Recipe.model_validate({"preprocessing": {"center_crop": 8}, "qat": qat})
        dataset = Dataset(kind=DatasetKind.images, num_samples=400, arrays=[], images={"label_source": label_source})
        return job_input_mismatches(info, dataset=dataset, recipe=recipe, max_decoded_bytes=2**30)

    [(field, _)] = mismatches({"label_weight": 1.0}, None)
    assert field == "recipe.qat.label_weight"
    assert mismatches({"label_weight": 1.0, "augment": {"flip": True, "crop_padding": 1}}, "folders") == []
