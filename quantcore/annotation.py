"""Stage 2, annotate: decide, by the platform's rules, which tensors are quantized and how.

Walks the prepared graph's nodes in order; a node excluded by op type or by an fnmatch pattern over
its name stays float; otherwise ``platform.rule_for(node)`` returns the node inputs to quantize with
their ``TensorQuantConfig``. A tensor read by several nodes gets one config and one Q/DQ pair shared
by every annotated consumer. When two rules want a tensor quantized differently, the first wins and
the later consumer reads the float tensor (recorded in ``warnings``).

Quantization points are ONNX tensor names, the names the user sees in Netron.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import onnx

from quantcore.config import QuantizeConfig
from quantcore.graph import GraphIndex
from quantcore.platforms import PLATFORMS
from quantcore.preparation import PreparedModel
from quantcore.rules import pass_through
from quantcore.tqc import TensorQuantConfig

# Per-node decisions recorded in Annotation.decisions
QUANTIZED, PASS_THROUGH, FLOAT, EXCLUDED = "quantized", "pass_through", "float", "excluded"


@dataclass(frozen=True)
class NodeInput:
    """Input ``index`` of node ``node`` (by node name)."""

    node: str
    index: int


@dataclass(frozen=True)
class Annotation:
    """Tensor name → its quantization, plus the node inputs that read the quantized value.

    configs: every quantized tensor's TQC (state INITIAL before calibration, ACTIVATED/PASSIVE after).
    consumers: tensor → the node inputs rewired to its DequantizeLinear output on export.
    parameters: the subset of ``configs`` that are initializers (weights), stored as int8 on export.
    decisions: node name → "quantized" | "pass_through" | "float" | "excluded".
    """

    configs: Mapping[str, TensorQuantConfig]
    consumers: Mapping[str, tuple[NodeInput, ...]]
    parameters: frozenset[str]
    decisions: Mapping[str, str]
    warnings: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))
        object.__setattr__(self, "consumers", MappingProxyType({k: tuple(v) for k, v in self.consumers.items()}))
        object.__setattr__(self, "decisions", MappingProxyType(dict(self.decisions)))
        if set(self.consumers) != set(self.configs):
            raise ValueError("configs and consumers must name the same tensors")
        if not self.parameters <= set(self.configs):
            raise ValueError("parameters must be a subset of the annotated tensors")

    @property
    def activations(self) -> list[str]:
        """Annotated tensors that are not parameters, in annotation order."""
        return [name for name in self.configs if name not in self.parameters]

    def with_configs(self, configs: Mapping[str, TensorQuantConfig]) -> Annotation:
        """A copy with ``configs`` replaced (same tensors required)."""
        if set(configs) != set(self.configs):
            raise ValueError("with_configs must keep the same tensors")
        return replace(self, configs=configs)

    def summary(self) -> dict[str, object]:
        """Counts for the report."""
        counts: dict[str, int] = {}
        for decision in self.decisions.values():
            counts[decision] = counts.get(decision, 0) + 1
        return {
            "quantized_activations": len(self.activations),
            "quantized_weights": len(self.parameters),
            "nodes": counts,
            "excluded_nodes": sorted(n for n, d in self.decisions.items() if d == EXCLUDED),
            "warnings": list(self.warnings),
        }


def is_excluded(node: onnx.NodeProto, config: QuantizeConfig) -> bool:
    """True when the node's op type or name matches the config's exclusions."""
    if node.op_type in config.exclude_op_types:
        return True
    return any(fnmatch.fnmatchcase(node.name, pattern) for pattern in config.exclude_node_patterns)


def annotate(prepared: PreparedModel, config: QuantizeConfig) -> Annotation:
    """Annotate ``prepared`` for ``config.platform``; the graph is not modified."""
    platform = PLATFORMS[config.platform]
    index = GraphIndex(prepared.model.graph)
    configs: dict[str, TensorQuantConfig] = {}
    consumers: dict[str, list[NodeInput]] = {}
    parameters: set[str] = set()
    decisions: dict[str, str] = {}
    warnings: list[str] = []

    for node in prepared.model.graph.node:
        if is_excluded(node, config):
            decisions[node.name] = EXCLUDED
            continue
        rule = platform.rule_for(node)
        accepted = 0
        for request in rule(node, index, config):
            name = node.input[request.input_index]
            existing = configs.get(name)
            if existing is not None and not existing.same_quantization(request.config):
                warnings.append(
                    f"{node.name} input {request.input_index} ({name}) left float: the tensor is "
                    f"already quantized differently for another consumer"
                )
                continue
            configs.setdefault(name, request.config)
            consumers.setdefault(name, []).append(NodeInput(node.name, request.input_index))
            if index.is_initializer(name):
                parameters.add(name)
            accepted += 1
        if accepted:
            decisions[node.name] = QUANTIZED
        else:
            decisions[node.name] = PASS_THROUGH if rule is pass_through else FLOAT
    return Annotation(
        configs=configs,
        consumers=consumers,
        parameters=frozenset(parameters),
        decisions=decisions,
        warnings=tuple(warnings),
    )
