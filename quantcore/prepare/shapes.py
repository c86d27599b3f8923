"""Shape inference that never stops a run, and graph-output declarations checked against it.

Converters declare output shapes that are wrong (a fixed size where the runtime produces another,
a rank that doesn't match) or purely symbolic. ONNX shape inference runs on a copy whose output
declarations are stripped, so a wrong declaration can't make it fail, and without the model's own
``value_info`` (converters leave stale entries, or sizes traced at one input size); it is retried
with them, and skipped with a warning (and no shape information at all) if it still fails.

Each declared output is then compared with what inference (or, given a sample, ONNX Runtime itself)
says: a conflicting rank, element type or fixed dimension is replaced by the runtime's answer —
a dimension that differs becomes symbolic rather than another fixed number — and the report says so.
Declarations that agree are kept as written, symbolic names and all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, shape_inference

from quantcore.graph.protobuf import skeleton
from quantcore.runtime.session import open_session


def _stripped(model: onnx.ModelProto, *, value_info: bool) -> onnx.ModelProto:
    """``model``'s skeleton (``quantcore.graph.protobuf``: weights are not copied, and one beyond 2 GiB can be
    inferred too) with its output shapes cleared, and its value_info unless ``value_info``."""
    copy, _ = skeleton(model)
    for output in copy.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    if not value_info:
        del copy.graph.value_info[:]
    return copy


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto | None, list[str]]:
    """(``model`` itself, its ``value_info`` replaced by inference's; the inferred skeleton with stripped
    outputs, or None; warnings).

    The model keeps its graph-output declarations; ``check_outputs`` reconciles them.
    """
    errors = []
    # the converter's own value_info first left out: stale or traced-at-one-size entries would be
    # merged into the result, and Shape folding (quantcore.prepare.folding) would bake them in as constants
    for keep_value_info in (False, True):
        try:
            inferred = shape_inference.infer_shapes(
                _stripped(model, value_info=keep_value_info), check_type=False, strict_mode=False, data_prop=True
            )
        except Exception as error:  # shape inference is an aid, not a requirement
            errors.append(str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__)
            continue
        del model.graph.value_info[:]
        outputs = {o.name for o in model.graph.output}
        model.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in outputs)
        return model, inferred, []
    del model.graph.value_info[:]  # unverified shapes are worse than none
    return model, None, [f"shape inference failed, continuing without it: {errors[-1]}"]


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str | None] | None:
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]


def _conflicts(declared: list, actual: list) -> bool:
    if len(declared) != len(actual):
        return True
    return any(isinstance(d, int) and isinstance(a, int) and d != a for d, a in zip(declared, actual, strict=True))


FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})


def empty_outputs(graph: onnx.GraphProto) -> dict[str, list[int | str | None]]:
    """The float outputs of ``graph``'s nodes that ``value_info`` (shape inference's, data propagation
    included) or the graph outputs give a dimension of 0, whatever the inputs: tensor → its dimensions.
    Such a tensor holds no element (a padding of length 0, a slice past the end)."""
    typed = [v for v in (*graph.value_info, *graph.output) if v.type.HasField("tensor_type")]
    declared = {v.name: v for v in typed if v.type.tensor_type.elem_type in FLOAT_TYPES}
    empty = {}
    for node in graph.node:
        for name in node.output:
            dims = _dims(declared[name]) if name in declared else None
            if dims is not None and 0 in dims:
                empty[name] = dims
    return empty


def runtime_outputs(
    model: onnx.ModelProto, sample: Mapping[str, np.ndarray], shapes_of: Sequence[str] = ()
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """The graph outputs ONNX Runtime produces for ``sample`` (one batch of every input), and the shapes
    the intermediate tensors ``shapes_of`` have in that run: Shape nodes appended for the run measure
    them, so the tensors themselves are not kept (``model`` is left as it was)."""
    initializers = {t.name for t in model.graph.initializer}
    feeds = {i.name: np.asarray(sample[i.name]) for i in model.graph.input if i.name not in initializers}
    names = [o.name for o in model.graph.output]
    probes = [helper.make_node("Shape", [t], [f"{t}:runtime_shape"]) for t in dict.fromkeys(shapes_of)]
    model.graph.node.extend(probes)
    try:
        with open_session(model, outputs=[p.output[0] for p in probes]) as session:
            values = session.run(None, feeds)
    finally:
        for _ in probes:
            model.graph.node.pop()
    shapes = {p.input[0]: tuple(int(d) for d in v) for p, v in zip(probes, values[len(names) :], strict=True)}
    return dict(zip(names, values[: len(names)], strict=True)), shapes


def check_outputs(
    model: onnx.ModelProto, inferred: onnx.ModelProto | None, actual: Mapping[str, np.ndarray] | None = None
) -> list[str]:
    """Replace graph-output declarations that conflict with inference or with ``actual`` runtime
    values (rules in the module docstring); returns one message per changed output. Mutates ``model``."""
    inferred_outputs = {o.name: o for o in inferred.graph.output} if inferred is not None else {}
    messages = []
    for output in model.graph.output:
        if not output.type.HasField("tensor_type"):
            continue
        declared = _dims(output)
        truth: list | None = None
        elem_type = None
        if actual is not None and output.name in actual:
            value = np.asarray(actual[output.name])
            truth = list(value.shape)
            elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)
        elif output.name in inferred_outputs:
            truth = _dims(inferred_outputs[output.name])
            elem_type = inferred_outputs[output.name].type.tensor_type.elem_type or None
        changed = []
        if elem_type and output.type.tensor_type.elem_type and elem_type != output.type.tensor_type.elem_type:
            output.type.tensor_type.elem_type = elem_type
            changed.append("element type")
        if declared is not None and truth is not None and _conflicts(declared, truth):
            fixed = []
            for axis, value in enumerate(truth):
                kept = declared[axis] if axis < len(declared) and len(declared) == len(truth) else None
                if isinstance(kept, str) or (isinstance(kept, int) and kept == value):
                    fixed.append(kept)
                elif actual is not None and isinstance(kept, int):
                    fixed.append(f"{output.name}_dim_{axis}")  # the runtime disagrees with a fixed size
                else:
                    fixed.append(value if actual is None else f"{output.name}_dim_{axis}")
            output.type.tensor_type.ClearField("shape")
            shape = output.type.tensor_type.shape
            for dim in fixed:
                entry = shape.dim.add()
                if isinstance(dim, int):
                    entry.dim_value = dim
                elif dim:
                    entry.dim_param = dim
            changed.append(f"shape {declared} -> {fixed}")
        if changed:
            messages.append(
                f"output {output.name!r}: declared {' and '.join(changed)} corrected to what the runtime produces"
            )
    return messages
