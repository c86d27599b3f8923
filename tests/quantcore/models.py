"""Small ONNX models built by hand with onnx.helper, independent of torch and of quantcore."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def conv_bn_residual(seed: int = 0, opset: int = 17, channels: int = 4) -> onnx.ModelProto:
    """input (N, 3, 8, 8) → Conv+BN → Relu → Conv+BN → Add(residual) → Relu → Flatten → Gemm(transB=1) → logits (N, 5).

    Node names "conv1", "bn1", "relu1", "conv2", "bn2", "add", "relu2", "flatten", "fc".
    """
    rng = np.random.default_rng(seed)
    c = channels

    def bn_params(prefix: str) -> list[onnx.TensorProto]:
        return [
            _init(f"{prefix}.gamma", rng.uniform(0.5, 1.5, c)),
            _init(f"{prefix}.beta", rng.normal(0, 0.1, c)),
            _init(f"{prefix}.mean", rng.normal(0, 0.2, c)),
            _init(f"{prefix}.var", rng.uniform(0.5, 2.0, c)),
        ]

    initializers = [
        _init("conv1.w", rng.normal(0, 0.3, (c, 3, 3, 3))),
        _init("conv1.b", rng.normal(0, 0.1, c)),
        *bn_params("bn1"),
        _init("conv2.w", rng.normal(0, 0.3, (c, c, 3, 3))),
        *bn_params("bn2"),
        _init("fc.w", rng.normal(0, 0.1, (5, c * 64))),
        _init("fc.b", rng.normal(0, 0.1, 5)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["c1", "bn1.gamma", "bn1.beta", "bn1.mean", "bn1.var"],
            ["b1"],
            name="bn1",
            epsilon=1e-5,
        ),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["c2", "bn2.gamma", "bn2.beta", "bn2.mean", "bn2.var"],
            ["b2"],
            name="bn2",
            epsilon=1e-3,
        ),
        helper.make_node("Add", ["b2", "r1"], ["sum"], name="add"),
        helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn_residual",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = 8
    helper.set_model_props(model, {"author": "tests", "purpose": "metadata must survive"})
    return model


def conv_relu_gemm(seed: int = 0, transB: int = 1) -> onnx.ModelProto:
    """input (N, 2, 6, 6) → Conv(2→3, 3x3, no pad, bias) → Relu → Flatten → Gemm(48→4) → out (N, 4).

    Small enough for a numpy reference in the tests.
    """
    rng = np.random.default_rng(seed)
    fc = rng.normal(0, 0.2, (4, 48))
    initializers = [
        _init("w", rng.normal(0, 0.4, (3, 2, 3, 3))),
        _init("b", rng.normal(0, 0.1, 3)),
        _init("fc.w", fc if transB else fc.T),
        _init("fc.b", rng.normal(0, 0.1, 4)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["conv"], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Flatten", ["relu"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["out"], name="fc", transB=transB),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_relu_gemm",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def matmul_convtranspose(seed: int = 0) -> onnx.ModelProto:
    """input (N, 4, 5, 5) → ConvTranspose(4→6) → Relu → Flatten → MatMul(W (6·7·7, 3)) → Add(bias) → out."""
    rng = np.random.default_rng(seed)
    initializers = [
        _init("deconv.w", rng.normal(0, 0.3, (4, 6, 3, 3))),  # (C_in, C_out, kH, kW)
        _init("mm.w", rng.normal(0, 0.05, (6 * 7 * 7, 3))),  # (K, N)
        _init("mm.b", rng.normal(0, 0.1, 3)),
    ]
    nodes = [
        helper.make_node("ConvTranspose", ["input", "deconv.w"], ["deconv"], name="deconv"),
        helper.make_node("Relu", ["deconv"], ["relu"], name="relu"),
        helper.make_node("Flatten", ["relu"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "mm.w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "mm.b"], ["out"], name="bias_add"),
    ]
    graph = helper.make_graph(
        nodes,
        "matmul_convtranspose",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 5, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def gemm_bn(seed: int = 0, transB: int = 0) -> onnx.ModelProto:
    """input (N, 6) → Gemm(alpha=0.5, beta=2, transB) → BN → out (N, 4)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.5, (4, 6))
    initializers = [
        _init("w", w if transB else w.T),
        _init("c", rng.normal(0, 0.1, 4)),
        _init("gamma", rng.uniform(0.5, 1.5, 4)),
        _init("beta", rng.normal(0, 0.1, 4)),
        _init("mean", rng.normal(0, 0.2, 4)),
        _init("var", rng.uniform(0.5, 2.0, 4)),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "w", "c"], ["y"], name="gemm", alpha=0.5, beta=2.0, transB=transB),
        helper.make_node("BatchNormalization", ["y", "gamma", "beta", "mean", "var"], ["out"], name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


def planted_outlier(seed: int = 0, outlier: float = 1000.0) -> onnx.ModelProto:
    """A CNN with one planted bad layer: input (N, 3, 8, 8) → conv1 → Relu → conv2 → Relu → conv3 → Relu →
    Flatten → Gemm → logits (N, 10), 8 channels, node names "conv1", "relu1", ..., "fc".

    conv2's output channel 0 is scaled by ``outlier`` (weights and a large positive bias) and conv3 reads
    that channel with weights divided by ``outlier``, so the FP32 function is an ordinary CNN but conv3's
    input holds one channel ``outlier`` times wider than the others: one per-tensor activation scale
    for it rounds the other seven channels to a few levels. conv3 is the layer quantization hurts.
    """
    rng = np.random.default_rng(seed)
    w2, b2 = rng.normal(0, 0.3, (8, 8, 3, 3)), rng.normal(0, 0.1, 8)
    w2[0] *= outlier
    b2[0] = outlier * (1.0 + abs(b2[0]))
    w3 = rng.normal(0, 0.3, (8, 8, 3, 3))
    w3[:, 0] /= outlier
    initializers = [
        _init("conv1.w", rng.normal(0, 0.3, (8, 3, 3, 3))),
        _init("conv1.b", rng.normal(0, 0.1, 8)),
        _init("conv2.w", w2),
        _init("conv2.b", b2),
        _init("conv3.w", w3),
        _init("conv3.b", rng.normal(0, 0.1, 8)),
        _init("fc.w", rng.normal(0, 0.05, (10, 8 * 64))),
        _init("fc.b", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "conv3.w", "conv3.b"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Flatten", ["r3"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "planted_outlier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 10
    return model


def masked_attention(seed: int = 0, width: int = 8) -> onnx.ModelProto:
    """A BERT layer's attention as Hugging Face exports it: x (N, T, width) float, mask (N, T) int64 (1 for a
    token, 0 for padding) → q, k, v = x·W + b → scores = q·kᵀ / √width + (1 - mask) · -3.4e38 → Softmax →
    context = p·v → context·Wo + bo + x (residual) → LayerNormalization → out.

    Node names: "q", "q.bias", "k", "k.bias", "v", "v.bias", "kt", "scores", "scale", "masked", "softmax",
    "context", "proj", "proj.bias", "residual", "norm"; the mask's: "mask.cast", "mask.inv", "mask.bias",
    "mask.rows" (tensor "mask_bias", (N, 1, T)).
    """
    rng = np.random.default_rng(seed)
    inits = [_init(f"W{n}", rng.normal(0, 1 / np.sqrt(width), (width, width))) for n in "qkvo"]
    inits += [_init(f"b{n}", rng.normal(0, 0.1, width)) for n in "qkvo"]
    inits += [_init("gamma", np.ones(width)), _init("beta", np.zeros(width)), _init("one", 1.0)]
    inits += [_init("lowest", np.finfo(np.float32).min), _init("root", np.sqrt(width))]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    nodes = [
        helper.make_node("Cast", ["mask"], ["mask_f"], name="mask.cast", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mask_f"], ["mask_inv"], name="mask.inv"),
        helper.make_node("Mul", ["mask_inv", "lowest"], ["mask_flat"], name="mask.bias"),
        helper.make_node("Unsqueeze", ["mask_flat", "axis1"], ["mask_bias"], name="mask.rows"),
    ]
    for n in "qkv":
        nodes.append(helper.make_node("MatMul", ["x", f"W{n}"], [f"{n}_raw"], name=n))
        nodes.append(helper.make_node("Add", [f"{n}_raw", f"b{n}"], [n], name=f"{n}.bias"))
    nodes += [
        helper.make_node("Transpose", ["k"], ["k_t"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "k_t"], ["s"], name="scores"),
        helper.make_node("Div", ["s", "root"], ["s_scaled"], name="scale"),
        helper.make_node("Add", ["s_scaled", "mask_bias"], ["s_masked"], name="masked"),
        helper.make_node("Softmax", ["s_masked"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c"], name="context"),
        helper.make_node("MatMul", ["c", "Wo"], ["o_raw"], name="proj"),
        helper.make_node("Add", ["o_raw", "bo"], ["o"], name="proj.bias"),
        helper.make_node("Add", ["o", "x"], ["h"], name="residual"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["out"], name="norm", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", width]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "T"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def padded_tokens(samples: int, tokens: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``masked_attention`` inputs: x normal, each sample's mask 1 on its first 2..``tokens`` positions."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, tokens + 1, samples)
    mask = (np.arange(tokens)[None] < lengths[:, None]).astype(np.int64)
    return {"x": rng.normal(size=(samples, tokens, width)).astype(np.float32), "mask": mask}


def two_heads(seed: int = 0) -> onnx.ModelProto:
    """input (N, 3, 8, 8) → Conv stem → Relu → features, an output read by Conv head_a → out_a and by
    Conv head_b → out_b: each head reaches one output only."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["input", "stem_w"], ["stem"], name="stem", pads=[1] * 4),
        helper.make_node("Relu", ["stem"], ["features"], name="relu"),
        helper.make_node("Conv", ["features", "a_w"], ["out_a"], name="head_a"),
        helper.make_node("Conv", ["features", "b_w"], ["out_b"], name="head_b"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_heads",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("out_a", "out_b", "features")],
        [
            _init(name, rng.normal(0, 0.3, shape))
            for name, shape in {"stem_w": (8, 3, 3, 3), "a_w": (2, 8, 1, 1), "b_w": (4, 8, 1, 1)}.items()
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def matmuls(count: int, rows: int = 64, width: int = 1024) -> onnx.ModelProto:
    """input (N, rows, width) → ``count`` chained MatMuls by a width x width weight → out: about
    N x count x 64 M multiply-adds at the defaults."""
    weight = numpy_helper.from_array(np.eye(width, dtype=np.float32) * 0.5, "w")
    names = ["input", *(f"t{i}" for i in range(count - 1)), "out"]
    nodes = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]], name=f"mm{i}") for i in range(count)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", rows, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", rows, width])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save(model: onnx.ModelProto, path) -> str:
    onnx.save_model(model, str(path))
    return str(path)
