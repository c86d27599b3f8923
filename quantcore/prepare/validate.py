"""Upload validation: is this file a usable ONNX model, and what does it look like?

``inspect_model`` checks, in order, and raises ``InvalidModelError`` with a human-readable reason at
the first failure:

1. the file exists and is non-empty;
2. it parses as an ONNX ModelProto (truncated files and random bytes fail here) and has a graph,
   an IR version and a default-domain opset;
3. the default-domain opset lies in [min_opset, max_opset];
4. every external-data ``location`` is relative and resolves (symlinks followed) inside the model
   file's directory, the file exists, and offset + length fit in it — checked before anything reads
   external data, so a hostile model can't make the service open files elsewhere;
5. ``onnx.checker.check_model`` on the path (external data resolved beside the model).

It returns plain JSON values describing the model (see ``inspect_model``).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import onnx

from quantcore.errors import InvalidModelError
from quantcore.graph.index import iter_tensors, value_type
from quantcore.runtime.batching import batch_axes

DEFAULT_MIN_OPSET = 7
DEFAULT_MAX_OPSET = min(23, onnx.defs.onnx_opset_version())  # newest opset ONNX Runtime 1.23 documents


def _parse(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise InvalidModelError(f"model file not found: {path.name}")
    if path.stat().st_size == 0:
        raise InvalidModelError("the model file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # DecodeError and friends on garbage input
        raise InvalidModelError(
            f"not a valid ONNX file (protobuf parse failed: {error}); the upload may be truncated or not an ONNX model"
        ) from error
    if model.ir_version <= 0:
        raise InvalidModelError(
            "not a valid ONNX file: no IR version (the upload may be truncated or not an ONNX model)"
        )
    if not model.HasField("graph") or not model.graph.node:
        raise InvalidModelError("not a valid ONNX file: the model has no graph nodes")
    return model


def _opset(model: onnx.ModelProto, min_opset: int, max_opset: int) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise InvalidModelError("the model does not import the default ONNX operator set")
    opset = int(versions[0])
    if not min_opset <= opset <= max_opset:
        raise InvalidModelError(f"opset {opset} is outside the supported range {min_opset}..{max_opset}")
    return opset


def check_external_data(model: onnx.ModelProto, directory: Path) -> None:
    """Refuse external-data locations that are absolute, leave ``directory`` (``..``, symlinks), name a
    missing file, or point past its end (``InvalidModelError`` naming the tensor)."""
    root = directory.resolve()
    for tensor in iter_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        label = f"tensor {tensor.name!r}"
        if not location:
            raise InvalidModelError(f"{label} is stored externally but names no location")
        if (
            os.path.isabs(location)
            or PurePosixPath(location).is_absolute()
            or PureWindowsPath(location).is_absolute()
            or PureWindowsPath(location).drive
        ):
            raise InvalidModelError(
                f"{label}: external data location {location!r} is an absolute path; "
                f"locations must be relative to the model file"
            )
        if ".." in PurePosixPath(location.replace("\\", "/")).parts:
            raise InvalidModelError(f"{label}: external data location {location!r} leaves the model's directory")
        target = (root / location).resolve()
        if not target.is_relative_to(root):
            raise InvalidModelError(
                f"{label}: external data location {location!r} resolves outside the model's directory"
            )
        if not target.is_file():
            raise InvalidModelError(
                f"{label}: external data file {location!r} is missing. The model keeps its weights in a separate "
                "file (torch.onnx.export with dynamo=True writes one by default): upload a zip of the model with "
                "its data files (quantctl zips model.onnx with model.onnx.data by itself), or save it as one file, "
                "onnx.save(onnx.load('model.onnx'), 'model-single.onnx'), or export with external_data=False"
            )
        try:
            offset = int(entries.get("offset", 0))
            length = int(entries["length"]) if "length" in entries else None
        except ValueError as error:
            raise InvalidModelError(f"{label}: malformed external data offset/length") from error
        size = target.stat().st_size
        if offset < 0 or offset > size or (length is not None and (length < 0 or offset + length > size)):
            raise InvalidModelError(
                f"{label}: external data range (offset {offset}, length {length}) exceeds {location!r} ({size} bytes)"
            )


def _count_nodes(graph: onnx.GraphProto, histogram: Counter) -> None:
    for node in graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        histogram[key] += 1
        for attribute in node.attribute:
            if attribute.HasField("g"):
                _count_nodes(attribute.g, histogram)
            for subgraph in attribute.graphs:
                _count_nodes(subgraph, histogram)


def _describe(values, skip: set[str]) -> list[dict[str, Any]]:
    described = []
    for value_info in values:
        if value_info.name in skip:
            continue
        dtype, shape = value_type(value_info)
        described.append({"name": value_info.name, "dtype": dtype, "shape": shape})
    return described


def inspect_model(
    path: str | Path, *, min_opset: int = DEFAULT_MIN_OPSET, max_opset: int = DEFAULT_MAX_OPSET
) -> dict[str, Any]:
    """Validate the ONNX file at ``path`` (steps in the module docstring) and describe it.

    Returns ``{"opset", "ir_version", "producer", "inputs", "outputs", "op_histogram",
    "num_parameters", "num_nodes"}``: inputs/outputs are ``[{"name", "dtype", "shape"}]`` with dtype
    a numpy name ("float32") and shape entries int (fixed), str (symbolic) or None (unknown);
    initializers also listed as graph inputs are not inputs. Each input also has ``"batch_axis"``, the
    axis its samples run along (None: a constant input such as a scalar sample rate), by
    ``quantcore.runtime.batching``'s rule, so that a service can check datasets without loading the model.
    ``op_histogram`` and ``num_nodes`` count subgraph nodes too (ops outside the default domain as
    "domain.Op"); ``num_parameters`` is the number of elements of all initializers.
    """
    path = Path(path)
    model = _parse(path)
    opset = _opset(model, min_opset, max_opset)
    check_external_data(model, path.parent)
    try:
        onnx.checker.check_model(str(path))
    except Exception as error:  # ValidationError and C++ errors of several kinds
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidModelError(f"the ONNX checker rejected the model: {reason}") from error

    histogram: Counter = Counter()
    _count_nodes(model.graph, histogram)
    initializer_names = {t.name for t in model.graph.initializer}
    num_parameters = 0
    for tensor in model.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= int(dim)
        num_parameters += count
    for sparse in model.graph.sparse_initializer:
        count = 1
        for dim in sparse.dims:
            count *= int(dim)
        num_parameters += count
        initializer_names.add(sparse.values.name)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    inputs = _describe(model.graph.input, initializer_names)
    for described, axis in zip(inputs, batch_axes([i["shape"] for i in inputs]), strict=True):
        described["batch_axis"] = axis
    return {
        "opset": opset,
        "ir_version": int(model.ir_version),
        "producer": producer,
        "inputs": inputs,
        "outputs": _describe(model.graph.output, set()),
        "op_histogram": dict(sorted(histogram.items())),
        "num_parameters": num_parameters,
        "num_nodes": sum(histogram.values()),
    }
