"""Stage 1, prepare: load the user's ONNX model and make it ready to annotate.

Steps, in order (each keeps every real graph input/output name, dtype and dynamic dimension):

1. load, external data included (``InvalidModelError`` if the file can't be parsed);
2. refuse models that are already quantized (``UnsupportedModelError``); inline model-local functions
   (``export_modules_as_functions``, onnxscript): a node inside a function cannot carry Q/DQ, so without
   this every layer a function wraps would stay float;
3. IR version newer than ONNX Runtime reads → lowered when the opsets allow; opset < 13 → upgraded
   to 13 (per-channel QuantizeLinear needs the ``axis`` attribute of opset 13); a failed conversion
   is an ``UnsupportedModelError`` (``quantcore.prepare.opset``);
4. initializers also listed as graph inputs (Paddle, old exporters) → treated as constants: removed
   from the inputs (``initializer_inputs``), so folding and weight quantization see them;
5. give unnamed nodes a name (exclusion patterns and reports speak node names); a float16 or bfloat16
   model made to compute in float32 inside, its inputs and outputs keeping their type, the Casts at its
   edges kept float (``quantcore.prepare.half_precision``: the rules quantize float32 tensors);
6. until nothing changes: infer shapes; fold constant subexpressions, including Shape/Size of
   statically shaped tensors and tf2onnx's weight → Transpose/Reshape → Conv chains
   (``quantcore.prepare.folding``); inline ``If`` nodes whose condition is now constant
   (``quantcore.prepare.branches``); with a ``sample`` (one batch of the given data), also Ifs whose
   condition depends on that data only through shapes or non-float input values;
7. ``auto_pad`` SAME_UPPER/SAME_LOWER → explicit pads (``quantcore.prepare.padding``);
8. fold BatchNormalization into Conv/ConvTranspose/Gemm; a Div by a float constant becomes a Mul by its
   reciprocal (``quantcore.prepare.division``: runtimes with an integer Mul and no integer Div);
9. infer shapes (a failure is tolerated and recorded in ``warnings``); correct graph-output
   declarations that contradict inference or, given a sample, ONNX Runtime (``quantcore.prepare.shapes``); a
   sample the model as given cannot run on either (a dimension declared symbolic that its weights fix)
   is an ``InvalidDataError`` naming the arrays and ONNX Runtime's reason;
   measure how many positions each attention's probabilities span (``attention_positions``,
   ``quantcore.prepare.attention``): on the sample's run where there is one, else where inference fixed it;
   list the float tensors inference gives a dimension of 0 (``empty_tensors``: a padding of length 0,
   say): they hold no element to take a range from, and ONNX Runtime 1.32's integer kernels crash the
   process on some (a QLinearMul on a (2, 0, 1) tensor, run on two threads), so no rule quantizes them;
10. mark nodes that must stay float whatever the platform: normalizations written out, Sqrt(a² + b²)
    magnitudes, powers written as products, recurrent ops, control flow left in the graph (``float_nodes``,
    ``quantcore.prepare.float_regions``), each with its reason; control flow left in place is also a warning;
    with the edge Casts of step 5, and the nodes whose float outputs are all empty (step 9).

The exported QDQ model is this prepared graph plus Q/DQ nodes, so BN stays folded in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
import onnx.inliner
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model

from quantcore.errors import InvalidDataError, InvalidModelError, QuantcoreError, UnsupportedModelError
from quantcore.graph.index import default_opset, ensure_node_names, external_locations
from quantcore.prepare import half_precision
from quantcore.prepare.attention import attention_positions, attention_products
from quantcore.prepare.branches import fold_constant_branches, fold_sample_branches
from quantcore.prepare.division import divisions_as_products
from quantcore.prepare.float_regions import float_regions
from quantcore.prepare.folding import (
    FoldedBatchNorm,
    fold_batchnorms,
    fold_constants,
    remove_dead_nodes,
    remove_unused_initializers,
    static_shapes,
)
from quantcore.prepare.opset import MIN_QDQ_OPSET, lower_ir_version, upgrade_opset
from quantcore.prepare.padding import explicit_auto_pad
from quantcore.prepare.shapes import check_outputs, empty_outputs, infer_shapes, runtime_outputs
from quantcore.prepare.validate import check_external_data
from quantcore.runtime.batching import describe
from quantcore.runtime.session import RUNTIME_ERRORS, open_session, runtime_message
from quantcore.wording import counted

MAX_FOLD_ROUNDS = 8  # shape inference / constant folding / If inlining rounds (nested Ifs need several)
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
    }
)


@dataclass(frozen=True)
class PreparedModel:
    """A loaded, simplified model ready for annotation. ``model`` is owned by this object; later stages
    read it and never leave it changed (export edits a copy)."""

    model: onnx.ModelProto
    source_path: Path | None
    source_opset: int
    folded_batchnorms: tuple[FoldedBatchNorm, ...]
    folded_constants: int
    renamed_nodes: int
    warnings: tuple[str, ...]
    # node name → why it stays float whatever the platform (normalizations written out, Sqrt(a² + b²)
    # magnitudes, powers written as products, LSTM/GRU/RNN, If/Loop/Scan left in the graph); annotation
    # must not quantize these nodes' inputs. ``name in float_nodes`` works.
    float_nodes: Mapping[str, str] = field(default_factory=dict)
    folded_branches: tuple[str, ...] = ()  # If nodes replaced by their taken branch
    initializer_inputs: tuple[str, ...] = ()  # initializers that were also listed as graph inputs
    explicit_pads: tuple[str, ...] = ()  # nodes whose SAME auto_pad became explicit pads
    divisions_as_products: tuple[str, ...] = ()  # Div nodes by a constant made Mul by its reciprocal (step 8)
    source_ir_version: int = 0
    widened_from: str | None = None  # "float16"/"bfloat16": the half type the model computed in (step 5)
    # MatMul name → positions its operand's Softmax distributions span (``quantcore.prepare.attention``), where known
    attention_positions: Mapping[str, int] = field(default_factory=dict)
    # float tensors with a dimension of 0 whatever the inputs (step 9): no rule quantizes them
    empty_tensors: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "float_nodes", MappingProxyType(dict(self.float_nodes)))
        object.__setattr__(self, "attention_positions", MappingProxyType(dict(self.attention_positions)))

    @property
    def opset(self) -> int:
        return default_opset(self.model) or MIN_QDQ_OPSET


def load_model(path: str | Path, *, external_data: bool = True) -> onnx.ModelProto:
    """Parse an ONNX file with its external data (``external_data=False``: its tensors left in their files,
    for a caller that reads them one at a time); unreadable files raise ``InvalidModelError``.

    External-data locations are checked (``quantcore.prepare.validate.check_external_data``) before any is
    read, so a model can't make us read files outside its own directory.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidModelError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf DecodeError on garbage or truncated files
        raise InvalidModelError(f"cannot load {path.name} as ONNX: {error}") from error
    if not external_locations(model):
        return model
    check_external_data(model, path.parent)
    if not external_data:
        return model
    try:
        load_external_data_for_model(model, str(path.parent))
        return model
    except Exception as error:  # OSError and friends while reading the data files
        raise InvalidModelError(f"cannot read the external data of {path.name}: {error}") from error


def drop_initializer_inputs(graph: onnx.GraphProto) -> list[str]:
    """Remove graph inputs that are also initializers (they become constants); returns their names."""
    initializers = {t.name for t in graph.initializer}
    listed = [i for i in graph.input if i.name in initializers]
    for value_info in listed:
        graph.input.remove(value_info)
    return [v.name for v in listed]


def _condition_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the initializers that are If conditions."""
    conditions = {n.input[0] for n in graph.node if n.op_type == "If"}
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in conditions}


def _simplify(
    proto: onnx.ModelProto, sample: Mapping[str, np.ndarray] | None, warnings: list[str]
) -> tuple[onnx.ModelProto, int, list[str]]:
    """Step 6 of the module docstring; returns (model, folded constant nodes, folded If names)."""
    folded_constants = 0
    folded_branches: list[str] = []
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
    float_inputs = {i.name for i in proto.graph.input if i.type.tensor_type.elem_type in float_types}
    inference_warnings: list[str] = []
    for _ in range(MAX_FOLD_ROUNDS):
        proto, _inferred, inference_warnings = infer_shapes(proto)
        folded_constants += fold_constants(proto, static_shapes(proto.graph))
        folded = fold_constant_branches(proto.graph, _condition_constants(proto.graph))
        if not folded and sample is not None and any(n.op_type == "If" for n in proto.graph.node):
            folded, messages = fold_sample_branches(proto, sample, float_inputs)
            warnings.extend(m for m in messages if m not in warnings)
        if not folded:
            break
        folded_branches.extend(folded)
    warnings.extend(inference_warnings)
    if folded_branches:
        remove_dead_nodes(proto.graph)  # what computed the conditions
        remove_unused_initializers(proto.graph)  # and the constants only they read
    return proto, folded_constants, folded_branches


def _inline_functions(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """``proto`` with its model-local functions inlined, and what was done (or, where ONNX's inliner
    refuses the model, ``proto`` as it was and why its functions' nodes stay float)."""
    names = sorted({f"{f.domain}.{f.name}" if f.domain else f.name for f in proto.functions})
    listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    try:
        inlined = onnx.inliner.inline_local_functions(proto, convert_version=True)
    except Exception as error:  # the C++ inliner's errors have no common type
        return proto, f"model-local functions ({listed}) could not be inlined, their nodes stay float: {error}"
    functions = counted(len(names), "model-local function")
    return inlined, f"{functions} inlined so that their nodes can be quantized: {listed}"


def _check_runs_as_given(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> None:
    """Raises ``InvalidDataError`` when ONNX Runtime loads the model as given but fails to run it on
    ``sample``: the data does not fit the model (a dimension its declaration leaves symbolic, but its
    weights fix), so the prepared model's failure on it is not the preparation's. A model ONNX Runtime
    cannot load as given (one that preparation makes loadable) tells nothing; nor does one that runs."""
    initializers = {t.name for t in model.graph.initializer}
    feeds = {i.name: np.asarray(sample[i.name]) for i in model.graph.input if i.name not in initializers}
    try:
        with open_session(model, spinning=False) as session:
            session.run(None, feeds)
    except QuantcoreError:  # not loadable as given
        return
    except RUNTIME_ERRORS as error:
        raise InvalidDataError(
            f"the data does not fit the model: ONNX Runtime fails to run the model as given on it ({describe(feeds)}): "
            f"{runtime_message(error)}"
        ) from error


def prepare(
    model: str | Path | onnx.ModelProto, *, sample: Mapping[str, np.ndarray] | None = None, external_data: bool = True
) -> PreparedModel:
    """Load (if given a path) and prepare a model; see the module docstring for the steps.

    external_data=False: a path's external tensors stay in their files (``load_model``), and the steps
    read none of them (a weight-only run that reads each weight as it quantizes it); no ``sample`` then,
    since ONNX Runtime cannot run the model without its data.

    sample: optional, one batch of every graph input (``{name: array}``, e.g. the first calibration
    batch). With it, Ifs whose condition depends on the data only through shapes or non-float
    inputs are folded for that data, and graph-output declarations are checked against ONNX Runtime; a
    sample that the model as given does not run on either raises ``InvalidDataError``.
    """
    source_path = None
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        source_path = Path(model)
        proto = load_model(source_path, external_data=external_data)

    quantized = sorted({n.op_type for n in proto.graph.node if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise UnsupportedModelError(f"the model is already quantized (it contains {', '.join(quantized)})")
    source_opset = default_opset(proto)
    if source_opset is None:
        raise InvalidModelError("model does not import the default ONNX operator set")
    source_ir_version = int(proto.ir_version)
    warnings: list[str] = []
    if proto.functions:
        proto, message = _inline_functions(proto)
        warnings.append(message)
    if source_opset < MIN_QDQ_OPSET:
        proto = upgrade_opset(proto)
        warnings.append(f"opset upgraded from {source_opset} to {MIN_QDQ_OPSET} for per-channel Q/DQ")
    if lower_ir_version(proto) is not None:
        warnings.append(f"IR version lowered from {source_ir_version} to {proto.ir_version} for ONNX Runtime")

    initializer_inputs = drop_initializer_inputs(proto.graph)
    renamed = ensure_node_names(proto.graph)
    widened = half_precision.widen(proto)
    if widened:
        warnings.append(
            f"the model computes in {widened.types}: it was made to compute in float32 inside to be quantized, its "
            f"inputs and outputs keep their types; the exported model computes in float32 between its Q/DQ "
            "nodes, and the errors reported are against the float32 computation of its weights"
        )
    proto, folded_constants, folded_branches = _simplify(proto, sample, warnings)
    explicit_pads = explicit_auto_pad(proto.graph)
    folded = fold_batchnorms(proto)
    divisions = divisions_as_products(proto.graph)
    proto, inferred, inference_warnings = infer_shapes(proto)
    warnings.extend(w for w in inference_warnings if w not in warnings)
    products = attention_products(proto.graph)
    shapes = static_shapes(proto.graph)
    actual = None
    if sample is not None:
        try:
            actual, measured = runtime_outputs(proto, sample, sorted({s.output[0] for s in products.values()}))
            shapes.update(measured)
        except Exception as error:  # the check is an aid; a model that can't run fails later, clearly
            if isinstance(error, RUNTIME_ERRORS):
                _check_runs_as_given(model if source_path is None else load_model(source_path), sample)
            warnings.append(f"the prepared model did not run on the sample: {str(error).strip()[:300]}")
    warnings.extend(check_outputs(proto, inferred, actual))
    empty = empty_outputs(proto.graph)
    reasons = {**_empty_nodes(proto.graph, empty), **float_regions(proto.graph), **(widened.edges if widened else {})}
    for node in proto.graph.node:
        if node.op_type in ("If", "Loop", "Scan") and not any(node.name in w for w in warnings):
            warnings.append(f"{node.op_type} {node.name!r} left in place: {reasons.get(node.name, 'not folded')}")
    return PreparedModel(
        model=proto,
        source_path=source_path,
        source_opset=source_opset,
        folded_batchnorms=tuple(folded),
        folded_constants=folded_constants,
        renamed_nodes=renamed,
        warnings=tuple(warnings),
        float_nodes=reasons,
        folded_branches=tuple(folded_branches),
        initializer_inputs=tuple(initializer_inputs),
        explicit_pads=tuple(explicit_pads),
        divisions_as_products=tuple(divisions),
        source_ir_version=source_ir_version,
        widened_from=widened.types if widened else None,
        attention_positions=attention_positions(products, shapes, default_opset(proto) or MIN_QDQ_OPSET),
        empty_tensors=frozenset(empty),
    )


def _empty_nodes(graph: onnx.GraphProto, empty: Mapping[str, list]) -> dict[str, str]:
    """Node name → reason, for the nodes all of whose outputs are in ``empty``: they compute nothing."""
    reasons = {}
    for node in graph.node:
        outputs = [name for name in node.output if name]
        if outputs and all(name in empty for name in outputs):
            shapes = ", ".join(f"{name} {empty[name]}" for name in outputs)
            reasons[node.name] = f"output with no element ({shapes}): nothing to quantize"
    return reasons
