"""Half-precision models computed in float32 inside, so that they can be quantized.

A model exported in float16 or bfloat16 (``model.half()`` before ``torch.onnx.export``, a converter's
float16 pass) holds its weights and activations in a type the platform rules do not quantize. ``widen``
rewrites it to compute in float32 while keeping its interface:

- every half-precision tensor the model stores (initializers, Constant and ConstantOfShape values, other
  tensor attributes, in subgraphs too) is stored as float32, which holds each of their values exactly;
- Cast to a half type, and the ``dtype`` of ops that make tensors (EyeLike, RandomNormal, ...), say
  float32; value_info and subgraph inputs and outputs of a half type become float32;
- a half-precision graph input is cast to float32 where it enters, a half-precision graph output is cast
  back from float32 where it leaves: names, element types and shapes stay what the user's code feeds and
  reads (``quantcore.graph.edges``). These edge Casts stay float (``Widened.edges``): a layer whose result
  the output Cast reads is the model's last, as if it wrote the output itself;
- Casts that then convert float32 to float32 (a converter's float32 islands, its casts at the edges) are
  removed, where shape inference knows their input's type, so that they do not stand between a layer
  and its quantization; where such a Cast wrote a graph output, the node before it writes the output.

The exported model then computes in float32 between its Q/DQ nodes, as ONNX Runtime's integer kernels
need and as TensorRT takes a QDQ model (its builder flags choose float16 for what stays float), and the
report's errors are against the float32 computation of the model's own weights. ``given_model_cost``
says, for the report, how far the model as given (ONNX Runtime running it in its half precision) is from
that computation on one batch, or that ONNX Runtime cannot run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantcore.graph.edges import cast_edges
from quantcore.graph.index import GraphIndex, iter_tensors, node_subgraphs, rename_reads
from quantcore.numerics.metrics import OutputAgreement
from quantcore.prepare.shapes import infer_shapes
from quantcore.runtime.session import open_session

HALF = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
TYPE_ATTRIBUTES = ("to", "dtype")  # Cast's target; the element type of EyeLike, Random*, Bernoulli...


@dataclass(frozen=True)
class Widened:
    types: str  # the half types the model used: "float16", "bfloat16" or "bfloat16 and float16"
    edges: dict[str, str]  # edge Cast name → what it does, for the report's node decisions


def widen(model: onnx.ModelProto) -> Widened | None:
    """Rewrite ``model`` (in place) as the module says; None, leaving it untouched, when it uses no half
    type."""
    found: set[int] = set()
    for tensor in iter_tensors(model.graph):
        if tensor.data_type in HALF:
            found.add(tensor.data_type)
            _widen_tensor(tensor)
    found |= _widen_graph(model.graph, interface=False)
    casts = cast_edges(model.graph, HALF, TensorProto.FLOAT, "_float32")
    found |= {cast.elem_type for cast in casts}
    if not found:
        return None
    _remove_identity_casts(model)
    edges = {
        cast.node: f"casts the float32 result to the {HALF[cast.elem_type]} output {cast.tensor!r}"
        if cast.output
        else f"casts the {HALF[cast.elem_type]} input {cast.tensor!r} to float32"
        for cast in casts
    }
    return Widened(" and ".join(sorted(HALF[t] for t in found)), edges)


def _widen_tensor(tensor: TensorProto) -> None:
    doc_string = tensor.doc_string
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    tensor.doc_string = doc_string


def _widen_type(type_proto: onnx.TypeProto) -> set[int]:
    """Half element types in ``type_proto`` (tensors, and those inside sequences, optionals and maps)
    set to float32; returns those it had."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor_type = getattr(type_proto, kind)
        if tensor_type.elem_type in HALF:
            found = {tensor_type.elem_type}
            tensor_type.elem_type = TensorProto.FLOAT
            return found
        return set()
    if kind in ("sequence_type", "optional_type"):
        return _widen_type(getattr(type_proto, kind).elem_type)
    if kind == "map_type":
        return _widen_type(type_proto.map_type.value_type)
    return set()


def _widen_graph(graph: onnx.GraphProto, *, interface: bool) -> set[int]:
    """Type attributes, value_info and (``interface``, a subgraph's) inputs and outputs of ``graph``
    and its subgraphs set to float32 where they were half; returns the half types met."""
    found: set[int] = set()
    values = [*graph.value_info, *(graph.input if interface else ()), *(graph.output if interface else ())]
    for value_info in values:
        found |= _widen_type(value_info.type)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.name in TYPE_ATTRIBUTES and attribute.type == onnx.AttributeProto.INT and attribute.i in HALF:
                found.add(attribute.i)
                attribute.i = TensorProto.FLOAT
            if attribute.HasField("tp"):
                found |= _widen_type(attribute.tp)
        for subgraph in node_subgraphs(node):
            found |= _widen_graph(subgraph, interface=True)
    return found


def _remove_identity_casts(model: onnx.ModelProto) -> None:
    """Remove main-graph Casts to float32 whose input inference knows to be float32. One that writes a
    graph output goes too where a node computes its input (not a graph output itself): that node then
    writes the output under its name."""
    infer_shapes(model)  # the model's value_info replaced by inference's
    graph = model.graph
    index = GraphIndex(graph)
    identities = [
        node
        for node in graph.node
        if node.op_type == "Cast"
        and _to(node) == TensorProto.FLOAT
        and index.elem_types.get(node.input[0]) == TensorProto.FLOAT
    ]
    sources = {node.output[0]: node.input[0] for node in identities if node.output[0] not in index.graph_outputs}

    def source(name: str) -> str:  # through a chain of them to the first one's input
        while name in sources:
            name = sources[name]
        return name

    writers: dict[str, str] = {}  # a node's result → the graph output it now writes
    for node in identities:
        computed, output = source(node.input[0]), node.output[0]
        written = computed in index.graph_outputs or computed in writers  # an output already: keep the Cast
        if output in index.graph_outputs and computed in index.producers and not written:
            writers[computed] = output
            sources[output] = computed
    if not sources:
        return
    renamed = {name: writers.get(source(name), source(name)) for name in [*sources, *writers]}
    kept = [node for node in graph.node if not (node.op_type == "Cast" and node.output[0] in sources)]
    for node in kept:
        node.output[:] = [writers.get(name, name) for name in node.output]
        rename_reads(node, renamed)
    del graph.node[:]
    graph.node.extend(kept)
    stale = [v for v in graph.value_info if v.name in renamed]
    for value_info in stale:
        graph.value_info.remove(value_info)


def _to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def given_model_cost(
    model_path: str | Path, reference: onnx.ModelProto, batch: Mapping[str, np.ndarray], types: str
) -> str:
    """A report warning: how far the model as given, run by ONNX Runtime in ``types``, is from
    ``reference`` (the float32 computation ``widen`` made of it) on ``batch``, as the SQNR of each float
    output; or why ONNX Runtime could not run it."""
    with open_session(reference) as session:
        names = [output.name for output in session.get_outputs()]
        expected = session.run(names, dict(batch))
    try:
        with open_session(model_path) as session:
            given = session.run(names, dict(batch))
    except Exception as error:  # ONNX Runtime's errors have no common type
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        return f"ONNX Runtime cannot run the model as given, in {types} ({reason}): only its float32 computation is run"
    figures = []
    for name, x, y in zip(names, expected, given, strict=True):
        agreement = OutputAgreement(argmax=False)
        agreement.update(x, y)
        result = agreement.result()
        if result["comparison"] != "numeric":
            continue
        if result["nonfinite"]:
            figures.append(f"{name!r} {result['nonfinite']} non-finite values")
        else:
            sqnr = result["sqnr_db"]
            figures.append(f"{name!r} exact" if sqnr is None else f"{name!r} {sqnr:.1f} dB")
    differs = (
        f"differs from its float32 computation by an SQNR of {', '.join(figures)}" if figures else "has no float output"
    )
    return f"on the first calibration batch, the model as given (ONNX Runtime, in {types}) {differs}"
