"""Weight-only RTN, HQQ, GPTQ and AWQ on models whose weights are in external data: the weights are read one at a time
from their file and the codes written straight to the exported model's own data file
(``quantcore.weight_only.tensors``), with the same bytes as the run that loads the whole model; and a
model past protobuf's 2 GiB, as the engine's large-model tests build one (``tests/quantcore/test_large_models.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from quantcore import QuantizeConfig, quantize
from quantcore.annotate.annotation import annotate
from quantcore.config import WeightOnlyConfig
from quantcore.prepare.preparation import prepare
from quantcore.weight_only.layers import weight_layers
from quantcore.weight_only.tensors import TensorReader
from samples.large import EMBEDDING_VOCAB, EMBEDDING_WIDTH, embedding_model, external_decoder, table_bytes

PLATFORM = "onnxruntime-weight-only"


def _config(algorithm: str, form: str, embeddings: bool = False) -> QuantizeConfig:
    options = WeightOnlyConfig(algorithm=algorithm, block_size=32, format=form, quantize_embeddings=embeddings)
    return QuantizeConfig(platform=PLATFORM, precision="w4", cpu_latency=False, weight_only=options)


def _tensors(path: Path) -> dict[str, bytes]:
    """Initializer name → its data's bytes, external data read in."""
    return {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize(
    ("algorithm", "form", "embeddings"),
    [
        ("rtn", "matmulnbits", False),
        ("hqq", "dequantize_linear", False),
        ("gptq", "matmulnbits", True),
        ("awq", "dequantize_linear", False),
    ],
)
def test_the_streamed_export_writes_the_bytes_of_the_in_memory_one(
    tmp_path: Path, algorithm: str, form: str, embeddings: bool
) -> None:
    """The same model stored with external data (streamed: weights read one at a time, the export's data
    file written as they come) and stored whole (loaded whole, exported in one file); with ``embeddings``,
    the table is read from the data file and its codes written to the export's as well."""
    (tmp_path / "external").mkdir()
    source = external_decoder(tmp_path / "external", d_model=64, layers=2)
    whole = tmp_path / "whole.onnx"
    onnx.save(onnx.load(str(source)), str(whole))
    data = {"input_ids": np.random.default_rng(1).integers(0, 256, size=(8, 8), dtype=np.int64)}
    config = _config(algorithm, form, embeddings)
    streamed = quantize(source, data, data, config, tmp_path / "streamed")
    loaded = quantize(whole, data, data, config, tmp_path / "loaded")

    # structure: external data in, external data out; the whole model in, one file out
    assert streamed.model_data_path == streamed.model_path.with_name("model.qdq.onnx.data")
    assert loaded.model_data_path is None
    header = onnx.load(str(streamed.model_path), load_external_data=False)
    external = {t.name for t in header.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    stored = "q4" if form == "matmulnbits" else "codes"
    assert external >= {f"{w}{i}_{stored}" for w in ("wq", "wup") for i in (0, 1)}
    assert ("embedding_q4" in external) == embeddings and ("embedding" in external) != embeddings
    assert streamed.model_path.stat().st_size < 20_000  # the graph alone: every weight is in the data file
    assert [n.op_type for n in header.graph.node] == [n.op_type for n in onnx.load(str(loaded.model_path)).graph.node]
    # numerics: the same codes, scales and kept weights, byte for byte
    assert _tensors(streamed.model_path) == _tensors(loaded.model_path)
    assert streamed.report["weight_only"]["layers"] == loaded.report["weight_only"]["layers"]


def test_a_run_that_streams_prepares_the_model_without_its_weights(tmp_path: Path) -> None:
    """What the streamed run quantizes from: the prepared model holds no weight, and each layer's W is
    read from the data file on demand, the values the whole model holds."""
    source = external_decoder(tmp_path, d_model=64, layers=1)
    prepared = prepare(source, external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in prepared.model.graph.initializer if len(t.dims) == 2)
    layers = weight_layers(prepared.model, annotate(prepared, _config("rtn", "matmulnbits")), TensorReader(tmp_path))
    whole = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(source)).graph.initializer}
    assert [layer.weight_name for layer in layers] == ["wq0", "wk0", "wv0", "wo0", "wup0", "wdown0"]
    for layer in layers:
        np.testing.assert_array_equal(layer.read(), whole[layer.weight_name])


def test_a_model_beyond_2_gib_is_quantized_from_its_data_file_to_another(tmp_path: Path) -> None:
    """token ids -> Gather from a 2.16 GB table -> MatMul (8192, 64): the table is kept (a Gather's), copied
    from the source's data file to the export's in chunks, the MatMul's weight quantized; no protobuf of
    the model with its data is ever made (protobuf cannot hold it)."""
    source, rows = embedding_model(tmp_path, hidden=64, external_weight=True)
    ids = np.random.default_rng(2).integers(0, EMBEDDING_VOCAB, size=(8, 16), dtype=np.int64)
    result = quantize(source, {"ids": ids[:4]}, {"ids": ids[4:]}, _config("rtn", "matmulnbits"), tmp_path / "out")

    header = onnx.load(str(result.model_path), load_external_data=False)
    assert [n.op_type for n in header.graph.node] == ["Gather", "MatMulNBits", "Relu"]
    assert result.model_data_path is not None and result.model_data_path.stat().st_size > table_bytes()
    stored = next(t for t in header.graph.initializer if t.name == "table")
    offset = int(next(e.value for e in stored.external_data if e.key == "offset"))
    copied = np.fromfile(result.model_data_path, np.float32, count=1000 * EMBEDDING_WIDTH, offset=offset)
    np.testing.assert_array_equal(copied.reshape(1000, EMBEDDING_WIDTH), rows)  # the table's bytes, exactly
    # numerics: w4 blocks of 32 keep about 20 dB of a Gaussian projection's output (measured 20.8 dB here)
    assert result.report["evaluation"]["qdq_exact"]["outputs"]["output"]["sqnr_db"] > 15
