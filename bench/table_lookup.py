"""One embedding lookup at w4, in the two forms the weight-only export writes a quantized table in, against
the FP32 Gather on the same table (the reference): ``com.microsoft.GatherBlockQuantized`` (format
``matmulnbits``) and a blocked DequantizeLinear before the Gather (format ``dequantize_linear``), which
ONNX Runtime's CPU EP runs over the whole table on every call. The table is random, (``--rows``,
``--width``), SmolLM2-135M's shape by default, rounded to nearest in blocks of 32 along each row by
quantcore's own writer; the indices are ``--tokens`` random rows. The three sessions
(``cpu_latency.latency_session``, as every CPU measurement here: intra-op spinning off) run in turn,
``--runs`` times each; the table gives each one's p50 and its ratio to FP32's, and checks that the two
quantized forms return the same rows. Run: ``.venv/bin/python -m bench.table_lookup``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore.evaluate.cpu_latency import latency_session
from quantcore.weight_only.blocks import BlockGrid, quantize_rtn
from quantcore.weight_only.writer import BLOCKED_DQ_OPSET, CONTRIB_DOMAIN, dequantize_tensors, gather_tensors

BLOCK = 32


def _model(nodes: list[onnx.NodeProto], tensors: list[onnx.TensorProto], tokens: int) -> bytes:
    graph = helper.make_graph(
        nodes,
        "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, tokens])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)],
        tensors,
    )
    opsets = [helper.make_opsetid("", BLOCKED_DQ_OPSET), helper.make_opsetid(CONTRIB_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def models(rows: int, width: int, tokens: int) -> dict[str, bytes]:
    """FP32 Gather, GatherBlockQuantized and DequantizeLinear → Gather of one random table."""
    table = np.random.default_rng(0).normal(size=(rows, width)).astype(np.float32)
    weight = quantize_rtn(table.T, BlockGrid(4, BLOCK, symmetric=True))  # W = tableᵀ, blocks along each row
    fused = gather_tensors(weight, "t")
    dequantized = dequantize_tensors(weight, True, "t")
    return {
        "FP32 Gather": _model(
            [helper.make_node("Gather", ["t", "ids"], ["rows"])], [numpy_helper.from_array(table, "t")], tokens
        ),
        "GatherBlockQuantized": _model(
            [
                helper.make_node(
                    "GatherBlockQuantized",
                    [fused[0].name, "ids", fused[1].name],
                    ["rows"],
                    domain=CONTRIB_DOMAIN,
                    gather_axis=0,
                    quantize_axis=1,
                    block_size=BLOCK,
                    bits=4,
                )
            ],
            fused,
            tokens,
        ),
        "DequantizeLinear -> Gather": _model(
            [
                helper.make_node("DequantizeLinear", [t.name for t in dequantized], ["d"], axis=1, block_size=BLOCK),
                helper.make_node("Gather", ["d", "ids"], ["rows"]),
            ],
            dequantized,
            tokens,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=49152)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    sessions = {
        name: latency_session(model, None) for name, model in models(args.rows, args.width, args.tokens).items()
    }
    feeds = {"ids": np.random.default_rng(1).integers(0, args.rows, size=(1, args.tokens), dtype=np.int64)}
    outputs = {name: session.run(None, feeds)[0] for name, session in sessions.items()}  # also the warm-up
    same = np.array_equal(outputs["GatherBlockQuantized"], outputs["DequantizeLinear -> Gather"])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.runs):
        for name, session in sessions.items():
            started = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - started)
    fp32 = statistics.median(times["FP32 Gather"])
    shape = f"table ({args.rows}, {args.width}), {args.tokens} token(s), w4 blocks of {BLOCK}"
    print(f"{shape}; the quantized forms return the same rows: {same}")
    print("| lookup | p50 ms | / FP32 |")
    print("| --- | --- | --- |")
    for name, measured in times.items():
        p50 = statistics.median(measured)
        print(f"| {name} | {1000 * p50:.4f} | {p50 / fp32:.1f} |")


if __name__ == "__main__":
    main()
