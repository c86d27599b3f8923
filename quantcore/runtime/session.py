"""ONNX Runtime sessions: the executor that runs whole graphs (FP32 references, calibration, and the
exported QDQ model both as exact Q/DQ arithmetic and as deployed with integer kernels).

Models under 2 GB go to ONNX Runtime as bytes. A bigger one goes as its skeleton
(``quantcore.graph.protobuf``) with the detached initializers beside it as arrays
(``SessionOptions.add_external_initializers``): nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
import onnxruntime as ort

from quantcore.errors import QuantcoreError
from quantcore.graph.protobuf import fits_in_protobuf, skeleton

# Exact Q/DQ runs at basic optimization (constant folding, no layout or fusion passes): the higher
# levels rewrite Q/DQ and the ops beside them whatever ``session.disable_quant_qdq`` says (ONNX Runtime
# 1.32's ReluQuantRewrite drops the Relu before a float8 QuantizeLinear: digits FP8 top-1 0.344 instead
# of 0.994, measured; its ClipQuantRewrite refuses a Clip before an int4/uint4 QuantizeLinear), and
# exact arithmetic needs none of them.
EXACT_OPTIMIZATION = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
# the session config entry that keeps the intra-op threads from spinning between parallel sections
SPIN_OFF = ("session.intra_op.allow_spinning", "0")
# every exception ONNX Runtime's Python binding raises (Fail, InvalidArgument, InvalidGraph, ...): plain
# Exception subclasses of its own module, which share no base class to catch them by
RUNTIME_ERRORS: tuple[type[Exception], ...] = tuple(
    value
    for value in vars(ort.capi.onnxruntime_pybind11_state).values()
    if isinstance(value, type) and issubclass(value, Exception)
)

# what ONNX Runtime's messages wrap around the reason: "[ONNXRuntimeError] : 1 : FAIL : ", and for a
# failed check the source location and the condition ("/onnxruntime_src/...h:563 void f(...) x == 1 was
# false. ")
_RUNTIME_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_NODE_FAILURE = re.compile(r"Non-zero status code returned while running (\S+) node\. Name:'([^']*)' Status Message: ")
_FAILED_CHECK = re.compile(r"\S+:\d+ [^\n]*? was false\. ")


def runtime_message(error: Exception, limit: int = 400) -> str:
    """ONNX Runtime's error, for people: its code prefix and the source location of a failed check
    dropped, the failing node named ("Mul node 'bn_mul': Attempting to broadcast an axis by a dimension
    other than 1. 3 by 16"); at most ``limit`` characters."""
    text = _RUNTIME_PREFIX.sub("", str(error).strip())
    text = _NODE_FAILURE.sub(lambda m: f"{m[1]} node {m[2]!r}: ", text)
    return _FAILED_CHECK.sub("", text)[:limit]


def error_line(error: Exception) -> str:
    """``error`` in one line for a report or a warning: its type and the first line of its message (ONNX
    Runtime's as ``runtime_message`` words it), at most 300 characters of it."""
    text = runtime_message(error) if isinstance(error, RUNTIME_ERRORS) else str(error)
    return f"{type(error).__name__}: {(text.strip().splitlines() or [''])[0][:300]}"


def session_device(device: str) -> str:
    """The device (``cpu`` or ``cuda``) of the ONNX Runtime sessions of a run whose ``QuantizeConfig.device``
    is ``device``: the CUDA EP only when ``cuda`` is asked for by name (``quantcore.runtime.device``)."""
    return "cuda" if device == "cuda" else "cpu"


def providers_for(device: str) -> list[str]:
    """Execution providers for ``QuantizeConfig.device`` ``device``: the CPU EP but for ``cuda``, whose
    CUDA EP falls back to the CPU EP for unsupported ops (``quantcore.runtime.device``)."""
    if session_device(device) == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise QuantcoreError(f"device 'cuda' requested but ONNX Runtime offers only {available}")
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


@contextlib.contextmanager
def open_session(
    model: onnx.ModelProto | bytes | str | Path,
    *,
    device: str = "cpu",
    exact_qdq: bool = False,
    optimization: ort.GraphOptimizationLevel | None = None,
    optimized_model_path: str | Path | None = None,
    spinning: bool = True,
    disabled_optimizers: Sequence[str] = (),
    outputs: Sequence[str] = (),
    in_node_order: bool = False,
) -> Iterator[ort.InferenceSession]:
    """An inference session for ``model``.

    exact_qdq=True sets ``session.disable_quant_qdq``: QuantizeLinear/DequantizeLinear run as written
    (float arithmetic with exact rounding) instead of being fused into integer kernels.
    optimization: ONNX Runtime's graph optimization level; by default ``EXACT_OPTIMIZATION`` with
    exact_qdq, all optimizations otherwise.
    optimized_model_path: where ONNX Runtime saves the graph it actually runs (after fusions).
    spinning=False: the intra-op threads sleep between parallel sections instead of busy-waiting, for
    callers that do their own work between runs (calibration's observers) on the same cores.
    disabled_optimizers: names of ONNX Runtime graph transformers or rewrite rules to skip (a deployment
    that must avoid a defective rewrite, ``quantcore.evaluate.parity``).
    outputs: intermediate tensors the session also returns, after the graph's outputs (``model`` must be
    a ModelProto; it is left as it was).
    in_node_order: ONNX Runtime's priority-based execution order instead of its default one, which
    follows the graph's node order more closely: for a graph laid out so that each tensor is consumed
    soon after it is made (``quantcore.analysis.graphwise``: on a PaddleOCR recognizer, batches of 16,
    its runs took 8.9 s and 310 MB where the default order took 33.7 s and 8427 MB; without the arena
    as well, 18.7 s and 4002 MB).
    """
    options = ort.SessionOptions()
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    if optimization is None:
        optimization = EXACT_OPTIMIZATION if exact_qdq else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.graph_optimization_level = optimization
    options.log_severity_level = 3  # errors only
    if in_node_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if not spinning:
        options.add_session_config_entry(*SPIN_OFF)
    if exact_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    providers = providers_for(device)
    detached: list[ort.OrtValue] = []  # referenced here until the session is closed
    if isinstance(model, onnx.ModelProto):
        source: str | bytes = _serialised(model, outputs, options, detached)
    elif outputs:
        raise ValueError("extra outputs need the model as a ModelProto")
    else:
        source = model if isinstance(model, bytes) else str(model)
    try:
        session = ort.InferenceSession(
            source, sess_options=options, providers=providers, disabled_optimizers=list(disabled_optimizers)
        )
    except Exception as error:  # ONNX Runtime raises its own exception types
        raise QuantcoreError(f"ONNX Runtime cannot load the model: {str(error).strip()[:500]}") from error
    yield session


def _serialised(
    model: onnx.ModelProto, outputs: Sequence[str], options: ort.SessionOptions, detached: list[ort.OrtValue]
) -> bytes:
    """``model`` serialised with ``outputs`` appended to its graph outputs (typed where its value_info
    knows them). Beyond the protobuf limit, its skeleton's; the detached initializers go to ``options``
    as arrays, appended to ``detached``."""
    if fits_in_protobuf(model):
        added = _add_outputs(model.graph, outputs)
        try:
            return model.SerializeToString()
        finally:
            for _ in range(added):
                model.graph.output.pop()
    header, tensors = skeleton(model)
    detached.extend(ort.OrtValue.ortvalue_from_numpy(onnx.numpy_helper.to_array(t)) for t in tensors)
    options.add_external_initializers([t.name for t in tensors], detached)
    _add_outputs(header.graph, outputs)
    return header.SerializeToString()


def _add_outputs(graph: onnx.GraphProto, names: Sequence[str]) -> int:
    """Appends the ``names`` not yet among ``graph``'s outputs to them; returns how many it appended."""
    known = {v.name: v for v in graph.value_info}
    existing = {o.name for o in graph.output}
    added = [n for n in dict.fromkeys(names) if n not in existing]
    graph.output.extend(known.get(n, onnx.ValueInfoProto(name=n)) for n in added)
    return len(added)
