"""The one place where the user-facing recipe becomes quantcore's own configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.recipe import Recipe
from quantcore import NodeOverride, QuantizeConfig, ReconstructionConfig
from quantcore.config import (
    AccuracyTarget,
    AnalysisOptions,
    AutoOptions,
    MixedPrecisionConfig,
    QatAugment,
    QatConfig,
    WeightOnlyConfig,
)


def to_quantize_config(recipe: Recipe, *, device: str = "auto", timing_cache: Path | None = None) -> QuantizeConfig:
    """Field by field: platform, precision, calibration observer/percentile/batch size, exclusions,
    per-node overrides (same order: the first matching pattern wins), reduce_range, the device (``auto``: torch
    trains on this host's GPU where it has one, ``quantcore.runtime.device``), and the
    deployment measurements (a TensorRT engine only for the tensorrt platforms; the onnxruntime platform
    measured beside it for a recipe that left the platform unnamed), the analysis bounds, the
    accuracy target, the reconstruction (seeded with the recipe's seed), QAT (seeded with its own seed or the
    recipe's), equalization, bias correction, SmoothQuant, mixed precision, the strategy and the auto search's
    budget, objective and candidates, the CPU deployment's objective, threads and batch sizes (the placement's
    timings kept in ``timing_cache``, a directory of the worker's; None: not kept), and the weight-only options
    (None: the platform's defaults, where it applies)."""
    spec = recipe.reconstruction
    reconstruction = (
        None
        if spec is None or spec.method == "none"
        else ReconstructionConfig(
            method=spec.method,
            iters=spec.iters,
            batch_size=spec.batch_size,
            num_samples=spec.num_samples,
            rounding_loss_weight=spec.rounding_loss_weight,
            warmup=spec.warmup,
            drop_prob=spec.drop_prob,
            cache_bytes=spec.cache_mb * 2**20,
            seed=recipe.seed,
        )
    )
    qat = recipe.qat
    qat_config = (
        None
        if qat is None
        else QatConfig(
            epochs=qat.epochs,
            steps=qat.steps,
            lr=qat.lr,
            scale_lr=qat.scale_lr,
            batch_size=qat.batch_size,
            num_samples=qat.num_samples,
            holdout=qat.holdout,
            loss=qat.loss,
            learn_scales=qat.learn_scales,
            label_weight=qat.label_weight,
            augment=None if qat.augment is None else QatAugment(qat.augment.flip, qat.augment.crop_padding),
            intermediate=tuple(qat.intermediate),
            seed=recipe.seed if qat.seed is None else qat.seed,
            checkpoint_every=qat.checkpoint_every,
        )
    )
    wo = recipe.weight_only
    weight_only = (
        None
        if wo is None
        else WeightOnlyConfig(
            algorithm=wo.algorithm,
            block_size=wo.block_size,
            symmetric=wo.symmetric,
            format=wo.format,
            act_order=wo.act_order,
            quantize_lm_head=wo.quantize_lm_head,
            quantize_embeddings=wo.quantize_embeddings,
            accuracy_level=wo.accuracy_level,
        )
    )
    return QuantizeConfig(
        platform=recipe.platform,
        weight_only=weight_only,
        precision=recipe.precision,
        observer=recipe.calibration.observer,
        percentile=recipe.calibration.percentile,
        percentile_candidates=tuple(recipe.calibration.percentile_candidates),
        batch_size=recipe.calibration.batch_size,
        exclude_op_types=tuple(recipe.exclude.op_types),
        exclude_node_patterns=tuple(recipe.exclude.node_patterns),
        overrides=tuple(NodeOverride(pattern=o.pattern, bits=o.bits, observer=o.observer) for o in recipe.overrides),
        reduce_range=recipe.reduce_range,
        device=device,
        cpu_latency=recipe.deploy.cpu_latency,
        tensorrt_engine=recipe.deploy.tensorrt_engine and recipe.platform.startswith("tensorrt"),
        cpu_objective=recipe.deploy.cpu_objective or "accuracy",
        cpu_threads=recipe.deploy.cpu_threads,
        cpu_batch_sizes=tuple(recipe.deploy.batch_sizes),
        cpu_timing_share=recipe.deploy.timing_share,
        cpu_timing_cache=None if timing_cache is None else str(timing_cache),
        cpu_alternative=recipe.platform_named is False and recipe.platform == "tensorrt",
        analysis=AnalysisOptions(
            enabled=recipe.analysis.enabled,
            graphwise_samples=recipe.analysis.graphwise_samples,
            layerwise_samples=recipe.analysis.layerwise_samples,
            max_layers=recipe.analysis.max_layers,
            layerwise_seconds=recipe.analysis.layerwise_seconds,
        ),
        target=None
        if recipe.target is None
        else AccuracyTarget(recipe.target.metric, recipe.target.threshold, recipe.target.max_float_layers),
        reconstruction=reconstruction,
        qat=qat_config,
        equalization=recipe.equalization,
        bias_correction=recipe.bias_correction,
        smoothquant=recipe.smoothquant,
        mixed_precision=None
        if recipe.mixed_precision is None
        else MixedPrecisionConfig(
            max_fraction=recipe.mixed_precision.max_fraction,
            objective=AccuracyTarget(recipe.mixed_precision.metric, recipe.mixed_precision.threshold),
        ),
        strategy=recipe.strategy,
        auto=AutoOptions(
            budget_seconds=recipe.auto.budget_seconds,
            objective=AccuracyTarget(
                recipe.auto.objective.metric, recipe.auto.objective.threshold, recipe.auto.objective.max_float_layers
            ),
            candidates=None if recipe.auto.candidates is None else tuple(recipe.auto.candidates),
        ),
    )


def parse_recipe(stored: dict[str, Any]) -> Recipe:
    return Recipe.model_validate(stored)
