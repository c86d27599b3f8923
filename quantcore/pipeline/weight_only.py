"""The weight-only run (platform ``onnxruntime-weight-only``):

    prepare → annotate → calibrate (AWQ: its search, segment by segment; GPTQ, RTN, HQQ: nothing)
        → export (quantize and write; GPTQ: XᵀX segment by segment as it goes) → evaluate → latency

prepare, evaluate and latency are the Q/DQ run's own stages (``quantcore.pipeline.quantization``,
``deployment``); annotate is too, and fails at once when the platform finds no MatMul/Gemm weight to
quantize (``quantcore.weight_only.layers.weight_layers``). There is no clip, reconstruct, place, analyze
(its per-tensor Q/DQ measurements have no Q/DQ to read), target or engine stage, and no resume
checkpoint. No algorithm holds a model whose weights are float32 in external data: prepare leaves the weights in
their file, AWQ's search and GPTQ read each segment's (``quantcore.weight_only.segments``), export reads
each weight as it quantizes it and writes its codes straight to the exported model's data file, and
evaluation's sessions read the files themselves. The
report is ``build_report``'s with its ``weight_only`` section (``weight_only_section``).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import onnx

from quantcore.annotate.annotation import Annotation
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import ExportResult
from quantcore.pipeline.deployment import evaluate_stage, latency_stage
from quantcore.pipeline.quantization import annotate_stage, prepare_stage
from quantcore.pipeline.run import Run
from quantcore.report.document import build_report
from quantcore.report.stage_results import Analyzed, PreparedInputs, QuantizedModel
from quantcore.weight_only import (
    embedding_layers,
    grid_of,
    make_plan,
    quantize_layers,
    quantize_sequentially,
    weight_layers,
    write,
)
from quantcore.weight_only.language import language_metrics, token_input
from quantcore.weight_only.tensors import TensorReader, is_external
from quantcore.wording import counted

FUSED_NOTE = (
    "deployed, ONNX Runtime fuses each DequantizeLinear -> MatMul into MatMulNBits with accuracy_level 4 (its "
    "session option session.qdq_matmulnbits_accuracy_level): activations are quantized to int8 per block inside "
    "the kernel; qdq_exact measures the weights' quantization alone"
)
INTEGER_PATH_NOTE = (
    "MatMulNBits runs with accuracy_level 4 (weight_only.accuracy_level): activations are quantized to int8 per "
    "block inside the kernel, in the exact and the deployed figures alike; accuracy_level 0 measures the weights' "
    "quantization alone"
)
WHOLE_TABLE_NOTE = (
    "each quantized embedding table is a DequantizeLinear before its Gather, which ONNX Runtime runs over the whole "
    "table on every call (bench.table_lookup, a 49,152 x 576 table at w4 on a 2-core EPYC: 29 ms a lookup, 424x an "
    "FP32 Gather's time, where format matmulnbits' GatherBlockQuantized takes 0.3x): this format's tables are for "
    "runtimes that fold it"
)
ANALYSIS_SKIPPED = "the layer-wise analysis measures Q/DQ tensors; a weight-only model has none (not run)"
KEPT_FLOAT_OPS = ("MatMul", "Gemm", "Gather")


def kept_float(model: onnx.ModelProto, annotation: Annotation) -> list[dict[str, str]]:
    """The MatMul/Gemm/Gather nodes with a constant weight that stay float, and why (the annotation's reason)."""
    initializers = {t.name for t in model.graph.initializer}
    rows = []
    for node in model.graph.node:
        weight = node.input[0] if node.op_type == "Gather" else (node.input[1] if len(node.input) > 1 else "")
        if node.op_type not in KEPT_FLOAT_OPS or weight not in initializers or weight in annotation.parameters:
            continue
        reason = annotation.reasons.get(node.name) or annotation.decisions.get(node.name, "float")
        rows.append({"node": node.name, "op_type": node.op_type, "weight": weight, "reason": reason})
    return rows


def weight_only_section(
    config: QuantizeConfig,
    model: onnx.ModelProto,
    layers: list[dict[str, Any]],
    floats: list[dict[str, str]],
    evaluation: dict[str, Any],
    language: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report's ``weight_only``: the options, each layer quantized and kept float, the sizes, the
    next-token agreement (the deployed model's argmax agreement over the last axis of each output of rank
    >= 3, a (batch, positions, vocabulary) logits output), a causal LM's perplexity and next-token accuracy
    (``language``, ``quantcore.weight_only.language``; None for other models), and notes on what the
    deployment computes."""
    options = config.weight_only
    assert options is not None
    fp32 = sum(row["fp32_bytes"] for row in layers)
    stored = sum(row["stored_bytes"] for row in layers)
    outputs = evaluation["qdq_deployed"]["outputs"] or evaluation["qdq_exact"]["outputs"]
    ranks = {o.name: len(o.type.tensor_type.shape.dim) for o in model.graph.output}
    kernels = evaluation["qdq_deployed"]["kernels"] or {}
    fused = options.format == "dequantize_linear" and any(op.endswith("MatMulNBits") for op in kernels)
    integer_path = options.format == "matmulnbits" and options.accuracy_level == 4
    section = {
        **options.to_dict(),
        "bits": config.precision_spec.weight_bits,
        "layers": layers,
        "kept_float": floats,
        "size": {
            "fp32_model_bytes": evaluation["model"]["fp32_bytes"],
            "model_bytes": evaluation["model"]["qdq_bytes"],
            "quantized_layers_fp32_bytes": fp32,
            "quantized_layers_bytes": stored,
            "quantized_layers_ratio": stored / fp32 if fp32 else None,
        },
        "next_token_agreement": {
            name: metrics["argmax_agreement"]
            for name, metrics in outputs.items()
            if ranks.get(name, 0) >= 3 and metrics["argmax_agreement"] is not None
        },
        "language_model": language,
        "notes": [FUSED_NOTE] if fused else [INTEGER_PATH_NOTE] if integer_path else [],
    }
    if options.format == "dequantize_linear" and any(row["op_type"] == "Gather" for row in layers):
        section["notes"].append(WHOLE_TABLE_NOTE)
    return section


def stored_outside(path: str | Path) -> tuple[bool, bool]:
    """(whether the model at ``path`` keeps tensors in external data, whether those are all float32: the
    tensors a weight-only run can read one at a time from their files)."""
    external = [t for t in onnx.load(str(path), load_external_data=False).graph.initializer if is_external(t)]
    return bool(external), bool(external) and all(t.data_type == onnx.TensorProto.FLOAT for t in external)


def quantize_weight_only(run: Run, config: QuantizeConfig) -> tuple[ExportResult, dict[str, Any]]:
    """Run the stages of the module docstring; returns the exported files and the report."""
    options = config.weight_only
    assert options is not None
    external, streamed = stored_outside(run.model_path)
    inputs: PreparedInputs = prepare_stage(run, config, external_data=not streamed)
    annotation = annotate_stage(run, inputs, config)
    model = inputs.prepared.model
    reader = TensorReader(Path(run.model_path).parent if streamed else None)
    layers = weight_layers(model, annotation, reader)  # no weight to quantize: fails here, before calibrate

    started = run.clock.begin("calibrate")
    plan, written = None, model
    if options.algorithm == "awq":
        plan = make_plan(model, layers, inputs.calibration, grid_of(config), config.device, run.monitor, reader)
        written = plan.scaled_model(model, reader, layers)
        scaled = sum(1 for choice in plan.choices.values() if choice.scale is not None)
        done = f"awq: XᵀX on {inputs.calibration.num_samples} samples, one segment at a time"
        done += f"; {counted(scaled, 'layer')} scaled"
    elif options.algorithm == "gptq":
        done = f"gptq: XᵀX on {inputs.calibration.num_samples} samples, one segment at a time during export"
    else:
        done = f"skipped: {options.algorithm} needs no calibration data"
    run.clock.end("calibrate", started, done)

    started = run.clock.begin("export")
    embeddings = embedding_layers(written, annotation, reader)  # rounded to nearest (HQQ with hqq) by any algorithm
    if options.algorithm == "gptq":
        quantized = quantize_sequentially(model, layers, inputs.calibration, config, run.monitor, reader)
        tables = quantize_layers(embeddings, config, run.monitor, before=len(layers))
        quantized = itertools.chain(quantized, tables)
    else:
        quantized = quantize_layers(layers + embeddings, config, run.monitor, plan)
    exported, rows = write(written, quantized, config, run.out_dir, reader, external)
    bits = config.precision_spec.weight_bits
    run.clock.end("export", started, f"{len(rows)} weights at {bits} bit as {options.format}")

    product = QuantizedModel(config, inputs.prepared, annotation, annotation, exported, None, None, resumed=())
    evaluated = evaluate_stage(run, inputs, product)
    tokens = token_input(model)
    language = None
    if tokens is not None:
        started = time.perf_counter()
        exported_path = evaluated.model.exported.model_path
        reference = str(run.model_path) if streamed else model  # ONNX Runtime reads the weights from their file
        language = language_metrics(reference, exported_path, inputs.evaluation, tokens, config.device, run.monitor)
        # one more pass of both models over the evaluation data: part of evaluating, so counted there
        run.clock.seconds["evaluate"] = round(run.clock.seconds["evaluate"] + time.perf_counter() - started, 3)
    latency = latency_stage(run, inputs, evaluated)
    floats = kept_float(model, annotation)
    section = weight_only_section(config, model, rows, floats, evaluated.evaluation, language)
    analyzed = Analyzed(None, (ANALYSIS_SKIPPED,))
    report = build_report(inputs, evaluated, analyzed, latency, None, run.clock.seconds, weight_only=section)
    return evaluated.model.exported, report
