"""Mixed precision for sensitive tensors (``quantcore.analysis.mixed_precision``, ``quantcore.annotate.widening``):
the planted sensitive layer promoted to 16 bits on onnxruntime and kept float on tensorrt, the exported
model run by ONNX Runtime, the cap, the config's refusals and the auto candidate."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from jobs.report_schema import Report
from quantcore import QuantizeConfig, annotate, prepare, quantize
from quantcore.auto import quantize_auto
from quantcore.auto.candidates import candidate_configs
from quantcore.config import (
    AccuracyTarget,
    AnalysisOptions,
    AutoOptions,
    MixedPrecisionConfig,
    ReconstructionConfig,
)
from tests.quantcore.models import planted_outlier, save
from tests.test_report_schema import undocumented

# planted_outlier: conv3 reads one channel 1000x wider than the other seven, through a weight column
# scaled down 1000x. Quantized at 8 bits its input keeps ~0 levels for the seven and its weight column
# rounds to zero, so the output cosine falls to ~0.2 (onnxruntime) / ~0.6 (tensorrt): far below 0.99.
RUINED = 0.9  # cosine of the model as quantized at 8 bits is below this on both platforms
OBJECTIVE = 0.99  # the default objective; promoted, conv3 reaches 0.9998 (16 bits) / 0.9999 (float)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = save(planted_outlier(), tmp_path_factory.mktemp("mixed") / "planted.onnx")
    rng = np.random.default_rng(0)
    calibration = {"input": rng.normal(size=(64, 3, 8, 8)).astype(np.float32)}
    evaluation = {"input": rng.normal(size=(32, 3, 8, 8)).astype(np.float32)}
    return path, calibration, evaluation


def _quiet(platform: str, **options) -> QuantizeConfig:
    """Only what these tests read: no clip search, analysis stage or latency."""
    return QuantizeConfig(
        platform=platform,
        percentile_candidates=(),
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        **options,
    )


def _cosine(report: dict, mode: str = "qdq_deployed") -> float:
    return report["evaluation"][mode]["outputs"]["logits"]["cosine"]


@pytest.mark.parametrize(
    ("platform", "form", "promoted_to"),
    [
        ("onnxruntime", "int16", {"r2": "uint16", "conv3.w": "int16"}),
        ("tensorrt", "float", None),
    ],
)
def test_the_sensitive_layer_is_promoted_and_fixes_the_model(planted, tmp_path, platform, form, promoted_to) -> None:
    path, calibration, evaluation = planted
    plain = quantize(path, calibration, evaluation, _quiet(platform), tmp_path / "plain")
    assert _cosine(plain.report) < RUINED and plain.report["mixed_precision"] is None

    result = quantize(
        path, calibration, evaluation, _quiet(platform, mixed_precision=MixedPrecisionConfig()), tmp_path / "mixed"
    )
    section = result.report["mixed_precision"]
    assert section["form"] == form and section["cap"] == 1  # 5 % of 4 layers, at least one
    assert [p["layer"] for p in section["promoted"]] == ["conv3"] and section["met"]
    assert section["before"] < RUINED <= OBJECTIVE <= section["after"]
    assert [s["promoted"] for s in section["steps"]] == [0, 1]
    # scored on the last 16 of the 64 calibration samples, which the baseline and the step did not calibrate on
    assert section["measured_on"].startswith("the last 16 calibration samples, held out")
    assert section["steps"][0]["calibration"] == "recalibrated"
    # the evaluation data, which the search never saw, agrees (deployed: ONNX Runtime's integer kernels)
    deployed = result.report["evaluation"]["qdq_deployed"]
    assert not deployed["skipped"] and not deployed["fallback"] and _cosine(result.report) >= OBJECTIVE
    qdq = onnx.load(str(result.model_path))
    types = {i.name: i.data_type for i in qdq.graph.initializer}
    # tensor -> its QuantizeLinear's zero point type (the stored type)
    quantized_types = {n.input[0]: types.get(n.input[2]) for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    config = result.report["config"]
    if form == "int16":
        assert section["promoted"][0]["tensors"] == promoted_to
        assert config["wide_tensors"] == ["r2", "conv3.w"] and "conv3" not in config["exclude_node_patterns"]
        assert quantized_types["r2"] == onnx.TensorProto.UINT16 and qdq.opset_import[0].version == 21
        assert "biases kept float beside a 16-bit tensor: conv3.b" in result.report["annotation"]["notes"]
    else:
        assert config["exclude_node_patterns"] == ["conv3"] and config["wide_tensors"] == []
        assert "r2" not in quantized_types  # conv3's input stays float: TensorRT builds the layer in float
        assert result.report["annotation"]["excluded_nodes"] == ["conv3"]
    # ONNX Runtime runs the exported file as written, to the evaluation's cosine
    session = ort.InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, evaluation)[0]
    ours = session.run(None, evaluation)[0]
    cosine = float((reference * ours).sum() / np.linalg.norm(reference) / np.linalg.norm(ours))
    assert cosine >= OBJECTIVE
    page = (result.report_path.parent / "report.html").read_text()
    assert "<h2>Mixed precision</h2>" in page and "conv3" in page.split("<h2>Mixed precision</h2>")[1]
    validated = Report.model_validate(result.report)  # the section is documented field by field
    assert undocumented(validated) == []


def test_nothing_is_ranked_or_promoted_when_the_objective_is_met(planted, tmp_path) -> None:
    path, calibration, evaluation = planted
    reachable = MixedPrecisionConfig(objective=AccuracyTarget("cosine", 0.1))  # 8 bits already give ~0.2
    result = quantize(path, calibration, evaluation, _quiet("onnxruntime", mixed_precision=reachable), tmp_path)
    section = result.report["mixed_precision"]
    assert section["met"] and section["promoted"] == [] and section["ranking_samples"] is None
    assert section["steps"] == [] and section["before"] == section["after"]
    assert "nothing promoted" in section["statement"] and result.report["config"]["wide_tensors"] == []


def test_the_cap_bounds_the_promotion_and_keeps_the_best_step(planted, tmp_path) -> None:
    path, calibration, evaluation = planted
    unreachable = MixedPrecisionConfig(max_fraction=0.5, objective=AccuracyTarget("sqnr", 200.0))
    result = quantize(path, calibration, evaluation, _quiet("tensorrt", mixed_precision=unreachable), tmp_path)
    section = result.report["mixed_precision"]
    assert section["cap"] == 2 and [s["promoted"] for s in section["steps"]] == [0, 1, 2]
    assert not section["met"] and "NOT met within the cap of 2 layers" in section["statement"]
    values = [s["value"] for s in section["steps"]]
    assert section["after"] == max(values)  # the best step is kept when none meets the objective
    assert len(section["promoted"]) == values.index(max(values))


def test_widening_takes_the_shared_scale_group_and_reports_unknown_names() -> None:
    prepared = prepare(planted_outlier())
    config = QuantizeConfig(platform="onnxruntime", wide_tensors=("flat", "nowhere"))
    annotation = annotate(prepared, config)
    configs = annotation.configs
    assert configs["flat"].dominator == "r3"  # Flatten moves r3's codes: one scale for both
    assert (configs["flat"].num_bits, configs["r3"].num_bits, configs["r2"].num_bits) == (16, 16, 8)
    assert (configs["r3"].quant_min, configs["r3"].quant_max) == (0, 2**16 - 1)
    assert "fc.b" not in annotation.biases and "conv3.b" in annotation.biases  # int32 could not hold fc.b
    assert any("nowhere is not quantized" in w for w in annotation.warnings)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"target": AccuracyTarget("cosine", 0.99)}, "mixed_precision and target"),
        ({"reconstruction": ReconstructionConfig(method="adaround")}, "mixed_precision and reconstruction"),
        ({"bias_correction": True}, "mixed_precision and bias_correction"),
        ({"platform": "onnxruntime-weight-only"}, "mixed_precision is not available"),
    ],
)
def test_mixed_precision_refuses_what_re_annotates_or_learns(options, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        QuantizeConfig(**{"platform": "onnxruntime", **options, "mixed_precision": MixedPrecisionConfig()})


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: MixedPrecisionConfig(max_fraction=0.0), "mixed_precision.max_fraction must be > 0"),
        (lambda: MixedPrecisionConfig(max_fraction=0.6), r"mixed_precision.max_fraction must be in \[0.0, 0.5\]"),
        (lambda: MixedPrecisionConfig(objective=AccuracyTarget("top1_drop", 1.0)), "objective.metric"),
        (lambda: QuantizeConfig(platform="tensorrt", wide_tensors=("x",)), "wide_tensors: platform 'tensorrt'"),
    ],
)
def test_bad_options_name_the_field(make, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        make()


def test_the_auto_candidate_aims_at_the_search_objective() -> None:
    def mixed(config: QuantizeConfig) -> QuantizeConfig | None:
        return next((c for candidate, c in candidate_configs(config) if candidate.name == "mixed_precision"), None)

    sqnr = AccuracyTarget("sqnr", 30.0)
    chosen = mixed(QuantizeConfig(platform="onnxruntime", strategy="auto", auto=AutoOptions(objective=sqnr)))
    assert chosen is not None and chosen.mixed_precision == MixedPrecisionConfig(objective=sqnr)
    assert chosen.strategy == "fixed"
    top1 = AutoOptions(objective=AccuracyTarget("top1_drop", 1.0))  # no labels on calibration samples: the default
    assert mixed(QuantizeConfig(strategy="auto", auto=top1)).mixed_precision == MixedPrecisionConfig()
    assert mixed(QuantizeConfig(strategy="auto", bias_correction=True)) is None  # not a config that runs
    names = [c.name for c, _ in candidate_configs(QuantizeConfig(strategy="auto"))]
    assert names.index("smoothquant") < names.index("mixed_precision") < names.index("adaround")


def test_the_auto_search_chooses_mixed_precision_for_the_planted_layer(planted, tmp_path) -> None:
    path, calibration, evaluation = planted
    auto = AutoOptions(budget_seconds=120, candidates=("mixed_precision",))
    config = QuantizeConfig(platform="tensorrt", strategy="auto", cpu_latency=False, auto=auto)
    result = quantize_auto(path, calibration, evaluation, config, tmp_path)
    section = result.report["auto"]
    values = {c["name"]: c["value"] for c in section["candidates"]}
    assert values["as_given"] < RUINED <= OBJECTIVE <= values["mixed_precision"]  # on the selection split
    assert section["chosen"] == "mixed_precision" and section["met"] and section["fallback"] is None
    assert result.report["config"]["exclude_node_patterns"] == ["conv3"] and _cosine(result.report) >= OBJECTIVE
