"""The recipe schema (pure pydantic, no server) and its translation into quantcore's config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobs.recipe import ONNXRUNTIME_PLATFORMS, PLATFORM_PRECISIONS, Recipe
from quantcore import PLATFORMS, NodeOverride, QuantizeConfig
from quantcore.config import AUTO_CANDIDATES, AccuracyTarget, AutoOptions
from quantcore.config import PLATFORM_PRECISIONS as ENGINE_PRECISIONS
from quantcore.observers.registry import ACTIVATION_OBSERVERS
from worker.translate import to_quantize_config


def error_of(recipe: dict) -> tuple[str, str]:
    """(dotted location, message) of the single validation error ``recipe`` raises."""
    with pytest.raises(ValidationError) as raised:
        Recipe.model_validate(recipe)
    errors = raised.value.errors()
    assert len(errors) == 1, errors
    return ".".join(str(p) for p in errors[0]["loc"]), errors[0]["msg"]


@pytest.mark.parametrize(
    "recipe",
    [
        {},
        {"platform": "tensorrt", "precision": "int8", "calibration": {"observer": "kl"}},
        {"platform": "tensorrt-fp8", "precision": "fp8", "calibration": {"observer": "floating"}},
        {"platform": "tensorrt-fp8"},
        {"platform": "onnxruntime", "precision": "w8a8", "reduce_range": "on"},
        {"platform": "onnxruntime-dynamic", "reduce_range": "off"},
        {"platform": "academic", "precision": "w4a4", "calibration": {"observer": "mse"}},
        {"platform": "academic", "precision": "w2a8"},
        {
            "platform": "onnxruntime",
            "exclude": {"op_types": ["Softmax"], "node_patterns": ["/head/*"]},
            "overrides": [{"pattern": "/stem/*", "observer": "minmax"}, {"pattern": "/fc", "bits": 8}],
            "calibration": {"observer": "ema_minmax", "batch_size": 8, "num_samples": 64},
        },
        {"target": {"metric": "top1_drop", "threshold": 0.5}, "analysis": {"layerwise_samples": 16}},
        {"analysis": {"layerwise_seconds": None}},
        {"target": {"metric": "cosine", "threshold": 0.999, "max_float_layers": 3}, "analysis": {"enabled": False}},
        {"platform": "onnxruntime-weight-only"},
        {
            "platform": "onnxruntime-weight-only",
            "precision": "w8",
            "weight_only": {"algorithm": "gptq", "block_size": 128, "symmetric": False, "format": "dequantize_linear"},
        },
    ],
)
def test_valid_recipes_translate_to_a_valid_config(recipe: dict) -> None:
    parsed = Recipe.model_validate(recipe)
    config = to_quantize_config(parsed)
    assert isinstance(config, QuantizeConfig)
    assert (config.platform, config.precision, config.observer) == (
        parsed.platform,
        parsed.precision,
        parsed.calibration.observer,
    )
    assert config.reduce_range == parsed.reduce_range
    assert config.exclude_op_types == tuple(parsed.exclude.op_types)
    assert [o.pattern for o in config.overrides] == [o.pattern for o in parsed.overrides]
    assert config.analysis.to_dict() == parsed.analysis.model_dump()
    assert (config.target and config.target.to_dict()) == (parsed.target and parsed.target.model_dump())


def test_a_recipe_without_precision_gets_its_platforms_own() -> None:
    assert [Recipe.model_validate({"platform": p}).precision for p in PLATFORM_PRECISIONS] == [
        "int8",
        "fp8",
        "int8",
        "int8",
        "w4",
        "int8",
    ]
    assert [QuantizeConfig(platform=p).precision for p in PLATFORM_PRECISIONS] == [
        "int8",
        "fp8",
        "int8",
        "int8",
        "w4",
        "int8",
    ]


def test_overrides_translate_in_order() -> None:
    parsed = Recipe.model_validate(
        {
            "platform": "academic",
            "precision": "w4a4",
            "overrides": [{"pattern": "a*", "bits": 6}, {"pattern": "*", "observer": "kl"}],
        }
    )
    assert to_quantize_config(parsed, device="cuda").overrides == (
        NodeOverride("a*", bits=6),
        NodeOverride("*", observer="kl"),
    )


def test_a_worker_trains_where_its_host_can() -> None:
    # auto: reconstruction and QAT on the worker's GPU where its torch sees one, ONNX Runtime on the CPU EP
    assert to_quantize_config(Recipe()).device == "auto"


@pytest.mark.parametrize(
    ("recipe", "field", "needle"),
    [
        ({"platform": "tpu"}, "platform", "tensorrt-fp8"),
        ({"precision": "int4"}, "precision", "should match pattern"),
        ({"precision": "w9a8", "platform": "academic"}, "precision", "should match pattern"),
        ({"precision": "fp8"}, "precision", "fp8 needs platform tensorrt-fp8"),
        ({"platform": "academic", "precision": "fp8"}, "precision", "fp8 needs platform tensorrt-fp8"),
        ({"platform": "tensorrt-fp8", "precision": "int8"}, "precision", "accepts precision fp8"),
        ({"platform": "onnxruntime", "precision": "w4a8"}, "precision", "int8 or w8a8"),
        ({"calibration": {"observer": "magic"}}, "calibration.observer", "minmax"),
        ({"calibration": {"observer": "constant"}}, "calibration.observer", "minmax"),
        ({"calibration": {"percentile": 150}}, "calibration.percentile", "less than or equal to 100"),
        ({"calibration": {"batch_size": 0}}, "calibration.batch_size", "greater than or equal to 1"),
        ({"overrides": [{"pattern": "x"}]}, "overrides.0", "bits and/or observer"),
        ({"overrides": [{"pattern": "", "bits": 8}]}, "overrides.0.pattern", "at least 1"),
        ({"overrides": [{"pattern": "x", "bits": 1}]}, "overrides.0.bits", "greater than or equal to 2"),
        ({"overrides": [{"pattern": "x", "bits": 16}]}, "overrides.0.bits", "less than or equal to 8"),
        ({"overrides": [{"pattern": "x", "observer": "typo"}]}, "overrides.0.observer", "minmax"),
        ({"overrides": [{"pattern": "x", "bits": 4, "turbo": 1}]}, "overrides.0.turbo", "Extra inputs"),
        (
            {"platform": "tensorrt-fp8", "precision": "fp8", "overrides": [{"pattern": "x", "bits": 4}]},
            "overrides",
            "fp8",
        ),
        ({"reduce_range": "on"}, "reduce_range", "platforms onnxruntime, onnxruntime-dynamic only"),
        ({"platform": "onnxruntime", "reduce_range": "maybe"}, "reduce_range", "'auto'"),
        ({"exclude": {"op_types": [""]}}, "exclude.op_types", "non-empty"),
        ({"exclude": {"node_patterns": ["*"] * 257}}, "exclude.node_patterns", "at most 256"),
        ({"turbo": True}, "turbo", "Extra inputs"),
        ({"target": {"metric": "accuracy", "threshold": 1}}, "target.metric", "top1_drop"),
        ({"target": {"metric": "cosine", "threshold": 1.5}}, "target.threshold", "[-1, 1]"),
        ({"target": {"metric": "sqnr"}}, "target.threshold", "Field required"),
        ({"target": {"metric": "sqnr", "threshold": 30, "max_float_layers": 0}}, "target.max_float_layers", "1"),
        ({"analysis": {"layerwise_samples": 0}}, "analysis.layerwise_samples", "greater than or equal to 1"),
        ({"analysis": {"layerwise_seconds": 0}}, "analysis.layerwise_seconds", "greater than 0"),
        (
            {"target": {"metric": "sqnr", "threshold": 30}, "reconstruction": {"method": "qdrop"}},
            "reconstruction",
            "cannot be combined with a target",
        ),
        ({"reconstruction": {"iters": 1_000_000}}, "reconstruction.iters", "less than or equal to 100000"),
        ({"reconstruction": {"method": "gptq"}}, "reconstruction.method", "'qdrop'"),
        ({"reconstruction": {"drop_prob": 2}}, "reconstruction.drop_prob", "less than or equal to 1"),
        ({"reconstruction": {"batch_size": 0}}, "reconstruction.batch_size", "greater than or equal to 1"),
        ({"reconstruction": {"iters": 10, "lr": 1}}, "reconstruction.lr", "Extra inputs"),
        ({"equalization": "maybe"}, "equalization", "valid boolean"),
        ({"bias_correction": [True]}, "bias_correction", "valid boolean"),
        ({"smoothquant": "maybe"}, "smoothquant", "valid boolean"),
        (
            {"target": {"metric": "sqnr", "threshold": 30}, "bias_correction": True},
            "bias_correction",
            "cannot be combined with a target",
        ),
        ({"strategy": "greedy"}, "strategy", "'fixed' or 'auto'"),
        (
            {"platform": "onnxruntime-weight-only", "weight_only": {"block_size": 48}},
            "weight_only.block_size",
            "power of two",
        ),
        ({"platform": "onnxruntime-weight-only", "weight_only": {"block_size": 8}}, "weight_only.block_size", "16"),
        ({"platform": "onnxruntime-weight-only", "weight_only": {"block_size": 512}}, "weight_only.block_size", "256"),
        (
            {"platform": "onnxruntime-weight-only", "weight_only": {"accuracy_level": 5}},
            "weight_only.accuracy_level",
            "4",
        ),
        (
            {"platform": "onnxruntime-weight-only", "weight_only": {"algorithm": "squeezellm"}},
            "weight_only.algorithm",
            "'awq' or 'hqq'",
        ),
        (
            {"platform": "onnxruntime-weight-only", "weight_only": {"format": "gguf"}},
            "weight_only.format",
            "'matmulnbits'",
        ),
        ({"platform": "onnxruntime", "weight_only": {}}, "weight_only", "needs platform onnxruntime-weight-only"),
        ({"platform": "onnxruntime-weight-only", "precision": "int8"}, "precision", "accepts precision w4 or w8"),
        ({"platform": "academic", "precision": "w4"}, "precision", "weight-only"),
        ({"platform": "onnxruntime-weight-only", "smoothquant": True}, "", "smoothquant do not apply"),
        ({"strategy": "auto", "auto": {"candidates": ["gptq"]}}, "auto.candidates.0", "'minmax'"),
        ({"strategy": "auto", "auto": {"candidates": []}}, "auto.candidates", "at least 1"),
        ({"strategy": "auto", "auto": {"budget_seconds": 5}}, "auto.budget_seconds", "greater than or equal to 10"),
        ({"auto": {"budget_seconds": 100_000}}, "auto.budget_seconds", "less than or equal to 86400"),
        ({"auto": {"objective": {"metric": "accuracy"}}}, "auto.objective.metric", "top1_drop"),
        ({"auto": {"objective": {"metric": "cosine", "threshold": 2}}}, "auto.objective.threshold", "[-1, 1]"),
        ({"auto": {"turbo": True}}, "auto.turbo", "Extra inputs"),
        (
            {"target": {"metric": "sqnr", "threshold": 30}, "strategy": "auto"},
            "strategy",
            "cannot be combined with a target",
        ),
    ],
)
def test_invalid_recipes_name_the_field(recipe: dict, field: str, needle: str) -> None:
    location, message = error_of(recipe)
    assert location == field and needle in message, (location, message)


def test_reconstruction_translates_with_the_recipe_seed() -> None:
    parsed = Recipe.model_validate(
        {
            "platform": "academic",
            "precision": "w4a4",
            "seed": 7,
            "reconstruction": {"method": "brecq", "iters": 500, "drop_prob": 0.25, "cache_mb": 64},
        }
    )
    reconstruction = to_quantize_config(parsed).reconstruction
    assert (reconstruction.method, reconstruction.iters, reconstruction.seed) == ("brecq", 500, 7)
    assert reconstruction.drop_prob == 0.25 and reconstruction.cache_bytes == 64 * 2**20
    assert to_quantize_config(Recipe.model_validate({})).reconstruction is None
    for off in ({"reconstruction": None}, {"reconstruction": {"method": "none", "iters": 10}}):
        assert to_quantize_config(Recipe.model_validate(off)).reconstruction is None


def test_equalization_and_bias_correction_translate_off_by_default() -> None:
    default = to_quantize_config(Recipe.model_validate({}))
    assert (default.equalization, default.bias_correction) == (False, False)
    chosen = to_quantize_config(Recipe.model_validate({"equalization": True, "bias_correction": True}))
    assert (chosen.equalization, chosen.bias_correction) == (True, True)
    assert chosen.to_dict()["equalization"] is True and chosen.to_dict()["bias_correction"] is True


def test_strategy_and_auto_translate() -> None:
    default = to_quantize_config(Recipe.model_validate({}))
    assert default.strategy == "fixed" and default.auto == AutoOptions()
    recipe = {
        "strategy": "auto",
        "auto": {"budget_seconds": 60, "objective": {"metric": "sqnr", "threshold": 25}, "candidates": ["kl", "mse"]},
    }
    config = to_quantize_config(Recipe.model_validate(recipe))
    assert config.strategy == "auto"
    assert config.auto == AutoOptions(60.0, AccuracyTarget("sqnr", 25.0), ("kl", "mse"))


def test_weight_only_translates() -> None:
    assert to_quantize_config(Recipe.model_validate({})).weight_only is None
    default = to_quantize_config(Recipe.model_validate({"platform": "onnxruntime-weight-only"}))
    assert default.precision == "w4" and default.weight_only is not None and default.weight_only.algorithm == "rtn"
    spec = {
        "algorithm": "gptq",
        "block_size": 64,
        "symmetric": False,
        "format": "dequantize_linear",
        "act_order": True,
        "accuracy_level": 1,
        "quantize_embeddings": True,
    }
    chosen = to_quantize_config(Recipe.model_validate({"platform": "onnxruntime-weight-only", "weight_only": spec}))
    assert chosen.to_dict()["weight_only"] == {**spec, "damping": 0.01, "quantize_lm_head": False}
    assert default.weight_only.accuracy_level == 4  # MatMulNBits' integer path on CPUs
    for algorithm in ("awq", "hqq"):
        recipe = Recipe.model_validate({"platform": "onnxruntime-weight-only", "weight_only": {"algorithm": algorithm}})
        assert to_quantize_config(recipe).weight_only.algorithm == algorithm


def test_smoothquant_translates_off_by_default() -> None:
    assert to_quantize_config(Recipe.model_validate({})).smoothquant is False
    chosen = to_quantize_config(Recipe.model_validate({"smoothquant": True}))
    assert chosen.smoothquant is True and chosen.to_dict()["smoothquant"] is True


def test_recipe_choices_match_quantcore() -> None:
    assert set(PLATFORM_PRECISIONS) == set(PLATFORMS)
    assert PLATFORM_PRECISIONS == ENGINE_PRECISIONS
    # reduce_range is accepted exactly where the engine's weights run on u8s8 kernels
    assert set(ONNXRUNTIME_PLATFORMS) == {name for name, p in PLATFORMS.items() if p.reduced_range_remedy}
    observers = set(Recipe.model_json_schema()["$defs"]["CalibrationSpec"]["properties"]["observer"]["enum"])
    assert observers == set(ACTIVATION_OBSERVERS)
    candidates = Recipe.model_json_schema()["$defs"]["AutoSpec"]["properties"]["candidates"]["anyOf"][0]["items"]
    assert tuple(candidates["enum"]) == AUTO_CANDIDATES


def test_schema_is_frozen_and_forbids_extras() -> None:
    recipe = Recipe()
    with pytest.raises(ValidationError):
        recipe.platform = "academic"  # type: ignore[misc]
    assert Recipe.model_config["extra"] == "forbid"
