"""Weight-only quantization (platform ``onnxruntime-weight-only``) of the small GPT-style decoder of
``samples.decoder`` (trained for a few seconds, exported with dynamic batch and sequence): structure
(checker, op counts, layers kept float and why, file size) and numerics (ONNX Runtime against a numpy
blockwise reference; GPTQ against round-to-nearest on its own objective) tested separately.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize
from quantcore.config import WeightOnlyConfig
from quantcore.errors import UnsupportedModelError
from quantcore.numerics.precision import parse_precision
from quantcore.runtime.session import open_session
from quantcore.weight_only.blocks import BlockGrid, quantize_rtn
from samples.decoder import DecoderModel, build_decoder
from tests.test_report_schema import undocumented

PLATFORM = "onnxruntime-weight-only"
QUANTIZED_LAYERS = 8  # 2 blocks x (qkv, proj, mlp.0, mlp.2); the LM head stays float


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[DecoderModel, Path]:
    built = build_decoder()
    path = tmp_path_factory.mktemp("decoder") / "decoder.onnx"
    onnx.save(built.model, str(path))
    return built, path


def _quantize(decoder, out: Path, precision: str = "w4", **options) -> dict:
    built, path = decoder
    config = QuantizeConfig(
        platform=PLATFORM,
        precision=precision,
        batch_size=16,
        cpu_latency=False,
        weight_only=WeightOnlyConfig(**options),
    )
    return quantize(path, built.calibration, built.evaluation, config, out).report


def _run(model: onnx.ModelProto | str, feeds: dict, outputs: list[str] = (), **options) -> dict[str, np.ndarray]:
    with open_session(model, outputs=outputs, **options) if outputs else open_session(model, **options) as session:
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))


def reference_rtn(w: np.ndarray, bits: int, block: int, symmetric: bool) -> np.ndarray:
    """Blockwise round-to-nearest of W (K, N) along K, written out independently of quantcore:
    symmetric s = -m / 2^(b-1) with m the signed value of largest magnitude of the block column, z = 2^(b-1);
    asymmetric s = (max - min) / (2^b - 1) over the block widened to 0, z = round(-min / s);
    ŵ = (clip(round(w / s) + z, 0, 2^b - 1) - z) · s."""
    levels = 2**bits - 1
    out = np.empty_like(w, dtype=np.float64)
    for start in range(0, w.shape[0], block):
        part = w[start : start + block].astype(np.float64)
        if symmetric:
            zero = 2.0 ** (bits - 1)
            largest = np.take_along_axis(part, np.abs(part).argmax(0)[None], axis=0)[0]
            scale = (-largest / zero).astype(np.float32).astype(np.float64)
        else:
            low, high = np.minimum(part.min(0), 0), np.maximum(part.max(0), 0)
            scale = ((high - low) / levels).astype(np.float32).astype(np.float64)
            zero = np.clip(np.round(-low / scale), 0, levels)
        out[start : start + block] = (np.clip(np.round(part / scale) + zero, 0, levels) - zero) * scale
    return out.astype(np.float32)


def test_precisions_and_config_validation() -> None:
    assert parse_precision("w4").weight_only and parse_precision("w8").weight_bits == 8
    assert QuantizeConfig(platform=PLATFORM).precision == "w4"
    bad_options = ({"block_size": 48}, {"block_size": 8}, {"block_size": 512}, {"algorithm": "sq"}, {"format": "gguf"})
    for bad in (*bad_options, {"accuracy_level": 5}, {"accuracy_level": True}, {"quantize_embeddings": "yes"}):
        with pytest.raises(ValueError, match="weight_only"):
            WeightOnlyConfig(**bad)
    with pytest.raises(ValueError, match="needs platform 'onnxruntime-weight-only'"):
        QuantizeConfig(platform="onnxruntime", weight_only=WeightOnlyConfig())
    with pytest.raises(ValueError, match="not available on platform"):
        QuantizeConfig(platform="academic", precision="w4")


EXPORTS = pytest.mark.parametrize(
    ("precision", "form", "symmetric"),
    [
        ("w4", "matmulnbits", True),
        ("w4", "matmulnbits", False),
        ("w4", "dequantize_linear", True),
        ("w4", "dequantize_linear", False),
        ("w8", "matmulnbits", True),
        ("w8", "dequantize_linear", False),
    ],
)


def reference_logits(path: Path, layers: list[dict], bits: int, symmetric: bool, feeds: dict) -> np.ndarray:
    """The FP32 graph at ``path`` run with each quantized weight of the report's ``layers`` replaced by
    ``reference_rtn``'s ŵ in blocks of 32 (an embedding table (V, D) in blocks along its rows)."""
    reference = onnx.load(str(path))
    initializers = {t.name: t for t in reference.graph.initializer}
    for row in layers:
        tensor = initializers[row["weight"]]
        w = numpy_helper.to_array(tensor)
        table = row["op_type"] == "Gather"  # the reference's K is the row length D
        rounded = reference_rtn(w.T if table else w, bits, 32, symmetric)
        tensor.CopyFrom(numpy_helper.from_array(rounded.T if table else rounded, tensor.name))
    return _run(reference, feeds)["logits"]


@EXPORTS
def test_rtn_export_structure_and_numerics(decoder, tmp_path: Path, precision: str, form: str, symmetric: bool) -> None:
    built, path = decoder
    # MatMulNBits' float path (accuracy_level 0): the weights' rounding alone, checked against the reference
    options = {"format": form, "symmetric": symmetric, "block_size": 32, "accuracy_level": 0}
    report = _quantize(decoder, tmp_path, precision, **options)
    exported_path = tmp_path / "model.qdq.onnx"
    onnx.checker.check_model(str(exported_path), full_check=True)
    exported = onnx.load(str(exported_path))
    op = "MatMulNBits" if form == "matmulnbits" else "DequantizeLinear"
    assert sum(n.op_type == op for n in exported.graph.node) == QUANTIZED_LAYERS
    section = report["weight_only"]
    assert len(section["layers"]) == QUANTIZED_LAYERS
    assert {row["op_type"]: row["reason"] for row in section["kept_float"]}.keys() == {"Gather", "MatMul"}
    assert any("LM head" in row["reason"] for row in section["kept_float"])
    assert section["next_token_agreement"]["logits"] is not None
    assert undocumented(Report.model_validate(report)) == []

    # size: what the file spends on the quantized layers (its bytes less the float ones it keeps)
    quantized_fp32 = section["size"]["quantized_layers_fp32_bytes"]
    spent = exported_path.stat().st_size - (path.stat().st_size - quantized_fp32)
    if precision == "w4":
        assert spent <= 0.35 * quantized_fp32, f"{spent} bytes for {quantized_fp32} FP32 bytes"

    # numerics: the FP32 graph with each quantized weight replaced by the numpy reference's ŵ
    feeds = {"tokens": built.evaluation["tokens"][:8]}
    expected = reference_logits(path, section["layers"], parse_precision(precision).weight_bits, symmetric, feeds)
    # exact_qdq: DequantizeLinear → MatMul as written (MatMulNBits is unaffected: at accuracy_level 0 it
    # computes in float32)
    actual = _run(str(exported_path), feeds, exact_qdq=True)["logits"]
    scale = float(np.abs(expected).max())
    # the same float32 ŵ on both sides: only the summation order differs (MatMulNBits' kernel blocks K)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4 * scale + 1e-5)
    if form == "dequantize_linear":
        # deployed, ONNX Runtime fuses DequantizeLinear → MatMul into MatMulNBits with accuracy_level 4
        # (int8 activations per block): measured 0.6 % of max|logits| apart at w4; the report says so
        deployed = _run(str(exported_path), feeds)["logits"]
        np.testing.assert_allclose(deployed, expected, rtol=0, atol=0.03 * scale)
        assert any("accuracy_level 4" in note for note in section["notes"])


def test_symmetric_grid_puts_the_largest_weight_on_the_lowest_code() -> None:
    """The symmetric grid's scale is signed: each block column's weight of largest magnitude, positive or
    negative, is reproduced exactly (code -2^(b-1)); a same-magnitude weight of the other sign is clipped
    by one step at most. The former grid, s = 2·max|w| / (2^b - 1), left a positive extreme half a step
    short."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 6)).astype(np.float32)
    w[5, :3], w[40, 3:] = 9.0, -9.0  # a positive and a negative extreme, in both blocks of 32
    w[20, 0] = -8.9  # the other sign, nearly as large, in the block of a positive extreme
    grid = BlockGrid(4, 32, symmetric=True)
    rounded = quantize_rtn(w, grid).dequantize()
    assert rounded[5, 0] == rounded[5, 1] == rounded[5, 2] == np.float32(9.0)
    assert np.all(rounded[40, 3:] == np.float32(-9.0))
    # s = -9/8: -8.9 is 7.91 steps up, clipped to the highest code, 7 steps: -7.875, one step short at most
    assert rounded[20, 0] == np.float32(-7.875)
    step = np.abs(w).reshape(2, 32, 6).max(axis=1) / 8  # per block column
    inside = np.abs(w - rounded).reshape(2, 32, 6) <= step[:, None, :] / 2 + 1e-6
    assert inside.sum() >= inside.size - 1  # every other weight within half a step


def test_symmetric_rtn_matches_onnx_runtimes_quantizer(decoder, tmp_path: Path) -> None:
    """Symmetric w4 RTN gives the logits ONNX Runtime's own symmetric ``MatMulNBitsQuantizer`` (its C++
    round-to-nearest) gives the same model: the same grid, written independently. Both at MatMulNBits'
    float path; 1e-4 of max|logits|: the summation order only (the former grid's logits missed it on 99 %
    of values)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    built, path = decoder
    _quantize(decoder, tmp_path, format="matmulnbits", block_size=32, symmetric=True, accuracy_level=0)
    head = next(n.name for n in onnx.load(str(path)).graph.node if n.output[0] == "logits")
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(path)), bits=4, block_size=32, is_symmetric=True, nodes_to_exclude=[head]
    )
    quantizer.process()
    feeds = {"tokens": built.evaluation["tokens"][:8]}
    theirs = _run(quantizer.model.model, feeds)["logits"]
    ours = _run(str(tmp_path / "model.qdq.onnx"), feeds)["logits"]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * float(np.abs(theirs).max()))


EMBEDDINGS = 2  # token and position tables


@EXPORTS
def test_embeddings_quantized_on_request(decoder, tmp_path: Path, precision: str, form: str, symmetric: bool) -> None:
    """With quantize_embeddings, each table becomes a GatherBlockQuantized (matmulnbits) or a blocked
    DequantizeLinear before its Gather (dequantize_linear), its rows rounded to nearest in blocks; the file
    shrinks by what the tables spent, and the lookups return the numpy reference's rows."""
    built, path = decoder
    options = {"format": form, "symmetric": symmetric, "block_size": 32, "accuracy_level": 0}
    report = _quantize(decoder, tmp_path / "tables", precision, quantize_embeddings=True, **options)
    _quantize(decoder, tmp_path / "float", precision, **options)  # the same without the tables, for the size
    exported_path = tmp_path / "tables" / "model.qdq.onnx"
    onnx.checker.check_model(str(exported_path), full_check=True)
    nodes = onnx.load(str(exported_path)).graph.node
    if form == "matmulnbits":
        assert sum(n.op_type == "GatherBlockQuantized" and n.domain == "com.microsoft" for n in nodes) == EMBEDDINGS
    else:
        assert sum(n.op_type == "DequantizeLinear" for n in nodes) == QUANTIZED_LAYERS + EMBEDDINGS
    section = report["weight_only"]
    tables = [row for row in section["layers"] if row["op_type"] == "Gather"]
    assert len(tables) == EMBEDDINGS and len(section["layers"]) == QUANTIZED_LAYERS + EMBEDDINGS
    assert [row["op_type"] for row in section["kept_float"]] == ["MatMul"]  # the LM head alone
    assert any("whole table on every call" in note for note in section["notes"]) == (form == "dequantize_linear")
    assert undocumented(Report.model_validate(report)) == []
    table_bytes = sum(row["fp32_bytes"] for row in tables)
    saved = (tmp_path / "float" / "model.qdq.onnx").stat().st_size - exported_path.stat().st_size
    stored = sum(row["stored_bytes"] for row in tables)
    assert saved >= table_bytes - stored - 2048, (saved, table_bytes, stored)  # names and node protos aside

    feeds = {"tokens": built.evaluation["tokens"][:8]}
    expected = reference_logits(path, section["layers"], parse_precision(precision).weight_bits, symmetric, feeds)
    actual = _run(str(exported_path), feeds, exact_qdq=True)["logits"]
    # the same float32 rows on both sides (a lookup does no arithmetic beyond (q - z)·s): only MatMulNBits'
    # summation order differs, as in the test of the layers alone
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()) + 1e-5)


def test_quantized_embeddings_match_onnx_runtimes_quantizer(decoder, tmp_path: Path) -> None:
    """Symmetric w4 with the tables quantized gives the logits of ONNX Runtime's own quantizer asked for
    MatMul and Gather (its GatherBlockQuantized of int4 codes, blocks along the rows): the same grid on the
    tables, written independently. 1e-4 of max|logits|: the summation order only (measured 3e-6 / 7.9)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    built, path = decoder
    _quantize(decoder, tmp_path, block_size=32, symmetric=True, accuracy_level=0, quantize_embeddings=True)
    head = next(n.name for n in onnx.load(str(path)).graph.node if n.output[0] == "logits")
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(path)),
        bits=4,
        block_size=32,
        is_symmetric=True,
        nodes_to_exclude=[head],
        op_types_to_quantize=("MatMul", "Gather"),
        quant_axes=(("MatMul", 0), ("Gather", 1)),  # blocks along K, and along each table row
    )
    quantizer.process()
    assert sum(n.op_type == "GatherBlockQuantized" for n in quantizer.model.model.graph.node) == EMBEDDINGS
    feeds = {"tokens": built.evaluation["tokens"][:8]}
    theirs = _run(quantizer.model.model, feeds)["logits"]
    ours = _run(str(tmp_path / "model.qdq.onnx"), feeds)["logits"]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * float(np.abs(theirs).max()))


def test_gptq_quantizes_the_tables_after_its_layers_with_progress_going_on(decoder, tmp_path: Path) -> None:
    """GPTQ's sequential layers, then the tables (rounded to nearest): the export stage's progress never
    goes back, and its last steps are the embeddings'."""
    built, path = decoder
    events: list[tuple[float, str]] = []
    config = QuantizeConfig(
        platform=PLATFORM,
        precision="w4",
        batch_size=16,
        cpu_latency=False,
        weight_only=WeightOnlyConfig(algorithm="gptq", quantize_embeddings=True),
    )
    progress = lambda stage, fraction, message: stage == "export" and events.append((fraction, message))  # noqa: E731
    report = quantize(path, built.calibration, built.evaluation, config, tmp_path, progress=progress).report
    fractions = [fraction for fraction, _ in events]
    assert fractions == sorted(fractions), events
    tail = [message for _, message in events[-EMBEDDINGS - 1 : -1]]  # before the stage's own closing event
    assert tail == ["gptq: embedding 1/2", "gptq: embedding 2/2"], events
    tables = [row for row in report["weight_only"]["layers"] if row["op_type"] == "Gather"]
    assert len(tables) == EMBEDDINGS and all("damping" not in row for row in tables)  # not GPTQ's


def _tables_model(path: Path) -> dict[str, np.ndarray]:
    """tokens → Gather(odd: 16 x 7) → MatMul(7 x 8) + Gather(tied: 16 x 8) → Gemm(B = tied, transB) →
    logits, and a Gather along axis 1 of a 3 x 16 table feeding an output; returns calibration data. The
    tied table is read by its Gather and by the head, one initializer (as tied embeddings export)."""
    rng = np.random.default_rng(0)
    tables = {
        "odd": rng.normal(size=(16, 7)),
        "w": rng.normal(size=(7, 8)),
        "tied": rng.normal(size=(16, 8)),
        "columns": rng.normal(size=(3, 16)),
    }
    nodes = [
        helper.make_node("Gather", ["odd", "tokens"], ["e"], name="odd_lookup"),
        helper.make_node("MatMul", ["e", "w"], ["h"], name="proj"),
        helper.make_node("Gather", ["tied", "tokens"], ["t"], name="tied_lookup"),
        helper.make_node("Add", ["h", "t"], ["s"], name="sum"),
        helper.make_node("Reshape", ["s", "rows"], ["s2"], name="flatten"),
        helper.make_node("Gemm", ["s2", "tied"], ["logits"], name="head", transB=1),
        helper.make_node("Gather", ["columns", "tokens"], ["c"], name="column_lookup", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tables",
        [helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, ["n", 5])],
        [
            helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["m", 16]),
            helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [3, "n", 5]),
        ],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tables.items()]
        + [numpy_helper.from_array(np.array([-1, 8], np.int64), "rows")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"tokens": rng.integers(0, 16, size=(8, 5))}


@pytest.mark.parametrize("precision", ["w4", "w8"])
def test_embeddings_kept_float_by_rule(tmp_path: Path, precision: str) -> None:
    """quantize_embeddings takes only a 2-D table gathered along axis 0 that nothing else reads; at w4 its
    rows must pack into whole bytes. Every other table stays float, and the report says why."""
    data = _tables_model(tmp_path / "tables.onnx")
    config = QuantizeConfig(
        platform=PLATFORM,
        precision=precision,
        batch_size=4,
        cpu_latency=False,
        weight_only=WeightOnlyConfig(block_size=16, quantize_embeddings=True, quantize_lm_head=True),
    )
    report = quantize(tmp_path / "tables.onnx", data, data, config, tmp_path / "out").report
    section = report["weight_only"]
    reasons = {row["node"]: row["reason"] for row in section["kept_float"]}
    assert "read by several nodes" in reasons["tied_lookup"] and "read by several nodes" in reasons["head"]
    assert "gathered along axis 0" in reasons["column_lookup"]
    quantized = {row["node"] for row in section["layers"]}
    if precision == "w4":
        assert "odd length 7" in reasons["odd_lookup"] and quantized == {"proj"}
    else:  # one code per byte: any row length
        assert "odd_lookup" not in reasons and quantized == {"proj", "odd_lookup"}
        assert report["evaluation"]["qdq_deployed"]["outputs"]["logits"]["cosine"] > 0.99


def test_matmulnbits_takes_the_integer_path_by_default(decoder, tmp_path: Path) -> None:
    """By default MatMulNBits carries accuracy_level 4 (int8 activations per block: ONNX Runtime's integer
    kernel, the one faster than FP32 on a CPU), the report says that its figures include it, and the logits
    stay within 3 % of max|logits| of the float path's (the int8 rounding of each block of activations;
    measured 0.6 % on the fused dequantize_linear export, which ONNX Runtime runs at the same level)."""
    built, _ = decoder
    floats = _quantize(decoder, tmp_path / "float", format="matmulnbits", accuracy_level=0)
    report = _quantize(decoder, tmp_path / "integer", format="matmulnbits")
    levels = {
        next(a.i for a in node.attribute if a.name == "accuracy_level")
        for node in onnx.load(str(tmp_path / "integer" / "model.qdq.onnx")).graph.node
        if node.op_type == "MatMulNBits"
    }
    assert levels == {4} and report["weight_only"]["accuracy_level"] == 4
    assert any("accuracy_level 4" in note for note in report["weight_only"]["notes"])
    assert floats["weight_only"]["notes"] == []
    feeds = {"tokens": built.evaluation["tokens"][:8]}
    reference = _run(str(tmp_path / "float" / "model.qdq.onnx"), feeds)["logits"]
    integer = _run(str(tmp_path / "integer" / "model.qdq.onnx"), feeds)["logits"]
    assert not np.array_equal(integer, reference)  # the attribute reached the kernel
    np.testing.assert_allclose(integer, reference, rtol=0, atol=0.03 * float(np.abs(reference).max()))


def _layer_errors(decoder, report: dict, out: Path) -> dict[str, float]:
    """‖XW - XŴ‖_F per layer on the calibration data: X from the FP32 model, Ŵ as ONNX Runtime
    dequantizes it (the DequantizeLinear outputs of the exported model)."""
    built, path = decoder
    model = onnx.load(str(path))
    nodes = {n.name: n for n in model.graph.node}
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rows = report["weight_only"]["layers"]
    feeds = dict(built.calibration)
    inputs = _run(model, feeds, [nodes[r["node"]].input[0] for r in rows])
    dequantized = _run(onnx.load(str(out / "model.qdq.onnx")), feeds, [f"{r['weight']}_dequantized" for r in rows])
    errors = {}
    for row in rows:
        x = inputs[nodes[row["node"]].input[0]].reshape(-1, row["shape"][0]).astype(np.float64)
        w, w_hat = weights[row["weight"]], dequantized[f"{row['weight']}_dequantized"]
        errors[row["node"]] = float(np.linalg.norm(x @ w - x @ w_hat.astype(np.float64)))
    return errors


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn(decoder, tmp_path: Path, act_order: bool) -> None:
    common = {"format": "dequantize_linear", "block_size": 32, "symmetric": True}
    rtn = _quantize(decoder, tmp_path / "rtn", algorithm="rtn", **common)
    gptq = _quantize(decoder, tmp_path / "gptq", algorithm="gptq", act_order=act_order, **common)
    rtn_errors = _layer_errors(decoder, rtn, tmp_path / "rtn")
    gptq_errors = _layer_errors(decoder, gptq, tmp_path / "gptq")
    for node, error in gptq_errors.items():  # GPTQ's objective: it must hold on every layer
        assert error < rtn_errors[node], f"{node}: GPTQ {error} >= RTN {rtn_errors[node]}"
    for row in gptq["weight_only"]["layers"]:  # the report's own figure, from XᵀX, says the same
        assert row["output_error"] < row["rtn_output_error"]
    sqnr = {
        name: report["evaluation"]["qdq_deployed"]["outputs"]["logits"]["sqnr_db"]
        for name, report in (("rtn", rtn), ("gptq", gptq))
    }
    # measured 27.0 dB (RTN) vs 30.4 dB (GPTQ) on this decoder (bench/weight_only.py): ask for 1 dB of the 3.4
    assert sqnr["gptq"] > sqnr["rtn"] + 1.0, sqnr


def test_model_without_matmul_weight_fails_in_annotate(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        "conv_only",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 3, 2, 2])],
        [numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")],
    )
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    data = {"x": np.ones((4, 2, 4, 4), np.float32)}
    stages: list[str] = []
    with pytest.raises(UnsupportedModelError, match="no MatMul or Gemm with a constant 2-D float32 weight"):
        quantize(
            path,
            data,
            data,
            QuantizeConfig(platform=PLATFORM),
            tmp_path / "out",
            progress=lambda s, f, m: stages.append(s),
        )
    assert "calibrate" not in stages
