"""Models past protobuf's 2 GiB, built without holding them whole: a chain of MatMuls whose weights
``external_tensor`` appends one at a time to the model's ``.data`` file. Used by the large-model tests
(tests/quantcore/test_large_models.py) and by ``bench.models.cases.large_cases`` (the 2.42 GB ``mlp-2g``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_chain(layers: int, width: int, weight: Callable[[int], onnx.TensorProto]) -> onnx.ModelProto:
    """input (N, width) -> ``layers`` x (MatMul "matmul{i}" by ``weight(i)``, a tensor named "w{i}"; Add of
    a zero bias "b{i}"; Relu) -> output (N, width)."""
    nodes, initializers, x = [], [], "input"
    for i in range(layers):
        initializers += [weight(i), numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        y = "output" if i == layers - 1 else f"r{i}"
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [y], name=f"relu{i}"),
        ]
        x = y
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width]) for name in ("input", "output")]
    graph = helper.make_graph(nodes, "chain", io[:1], io[1:], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def external_tensor(name: str, array: np.ndarray, data) -> onnx.TensorProto:
    """A tensor whose data ``array`` is appended to the open file ``data`` (named ``<model>.data``,
    beside the model): how a model past 2 GiB is written without holding it in one protobuf."""
    tensor = TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", Path(data.name).name), ("offset", str(data.tell())), ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    array.tofile(data)
    return tensor


def external_decoder(directory: Path, *, d_model: int, layers: int, vocab: int = 256, seed: int = 0) -> Path:
    """A decoder-shaped model written to ``directory/model.onnx`` with every weight in ``model.onnx.data``,
    one tensor generated and appended at a time (the weight-only memory bench and large-model tests):
    ``input_ids`` (batch, T) int64 -> Gather from a (vocab, d) table -> ``layers`` x (LayerNormalization,
    q/k/v MatMuls (d, d), single-head attention (q·kᵀ/√d, Softmax, ·v), output MatMul (d, d), residual Add,
    LayerNormalization, MLP MatMuls (d, 4d) and (4d, d) around a Relu, residual Add) -> LayerNormalization
    -> LM head MatMul (d, vocab) -> ``logits`` (batch, T, vocab). 12·d²·layers + 2·vocab·d float32
    weights. Returns the model's path."""
    rng = np.random.default_rng(seed)
    d = d_model
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    with open(directory / "model.onnx.data", "wb") as data:

        def weight(name: str, rows: int, columns: int) -> str:
            values = rng.standard_normal((rows, columns), dtype=np.float32) * np.float32(rows**-0.5)
            initializers.append(external_tensor(name, values, data))
            return name

        def norm(name: str, x: str) -> str:
            nodes.append(helper.make_node("LayerNormalization", [x, "gamma", "beta"], [name], name=name, axis=-1))
            return name

        def matmul(name: str, x: str, w: str) -> str:
            nodes.append(helper.make_node("MatMul", [x, w], [name], name=name))
            return name

        def op(op_type: str, name: str, *inputs: str, **attributes: object) -> str:
            nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attributes))
            return name

        nodes.append(helper.make_node("Gather", [weight("embedding", vocab, d), "input_ids"], ["x0"], name="embed"))
        x = "x0"
        for i in range(layers):
            h = norm(f"ln{i}a", x)
            q, k, v = (matmul(f"{p}{i}", h, weight(f"w{p}{i}", d, d)) for p in "qkv")
            keys = op("Transpose", f"kt{i}", k, perm=[0, 2, 1])
            scores = op("Mul", f"scaled{i}", matmul(f"scores{i}", q, keys), "inverse_sqrt_d")
            attended = matmul(f"attended{i}", op("Softmax", f"softmax{i}", scores, axis=-1), v)
            x = op("Add", f"x{i}a", x, matmul(f"o{i}", attended, weight(f"wo{i}", d, d)))
            up = op("Relu", f"relu{i}", matmul(f"up{i}", norm(f"ln{i}b", x), weight(f"wup{i}", d, 4 * d)))
            x = op("Add", f"x{i}b", x, matmul(f"down{i}", up, weight(f"wdown{i}", 4 * d, d)))
        matmul("logits", norm("ln_final", x), weight("head", d, vocab))
    initializers += [
        numpy_helper.from_array(np.ones(d, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(d, np.float32), "beta"),
        numpy_helper.from_array(np.array(d**-0.5, np.float32), "inverse_sqrt_d"),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "T"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "T", vocab])],
        initializers,
    )
    path = directory / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


EMBEDDING_VOCAB, EMBEDDING_WIDTH = 66_000, 8192  # a 2.16 GB float32 table: past protobuf's 2 GiB by 15 MB


def embedding_model(directory: Path, *, hidden: int, external_weight: bool = False) -> tuple[Path, np.ndarray]:
    """token ids (batch, 16) -> Gather from a 2.16 GB table (written straight to ``model.onnx.data``) ->
    MatMul (EMBEDDING_WIDTH, ``hidden``) -> Relu, saved as ``directory/model.onnx``; the MatMul's weight
    in the data file too with ``external_weight``. Returns the model's path and the table's first 1000
    rows (the table repeats them)."""
    rows = np.random.default_rng(0).normal(size=(1000, EMBEDDING_WIDTH)).astype(np.float32)
    weight = np.random.default_rng(1).normal(scale=EMBEDDING_WIDTH**-0.5, size=(EMBEDDING_WIDTH, hidden))
    with open(directory / "model.onnx.data", "wb") as data:
        table = external_tensor("table", rows, data)  # the first rows, then the same rows again, ...
        for start in range(1000, EMBEDDING_VOCAB, 1000):
            rows[: min(1000, EMBEDDING_VOCAB - start)].tofile(data)
        projection = (
            external_tensor("w", weight.astype(np.float32), data)
            if external_weight
            else numpy_helper.from_array(weight.astype(np.float32), "w")
        )
    table.dims[0] = EMBEDDING_VOCAB
    next(entry for entry in table.external_data if entry.key == "length").value = str(table_bytes())
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed"),
            helper.make_node("MatMul", ["embedded", "w"], ["projected"], name="project"),
            helper.make_node("Relu", ["projected"], ["output"], name="relu"),
        ],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 16, hidden])],
        [table, projection],
    )
    path = directory / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, rows


def table_bytes() -> int:
    return EMBEDDING_VOCAB * EMBEDDING_WIDTH * 4
