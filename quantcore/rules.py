"""The vocabulary of platform rule sets: a rule looks at one node and says which of its inputs to
quantize and how.

A platform is data: ``Platform(rules={"Conv": quantize_conv, ...})``, looked up with
``platform.rules.get(op_type, keep_float)``. Rules are pure functions of the node, the graph index and
the run's ``QuantizeConfig``; they never edit the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx

from quantcore.config import QuantizeConfig
from quantcore.graph import GraphIndex
from quantcore.tqc import TensorQuantConfig


@dataclass(frozen=True)
class QuantRequest:
    """Quantize input ``input_index`` of the node with ``config`` (Q/DQ inserted in front of it)."""

    input_index: int
    config: TensorQuantConfig


Rule = Callable[[onnx.NodeProto, GraphIndex, QuantizeConfig], list[QuantRequest]]


def keep_float(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """Default rule: the node runs in float, no input is quantized."""
    return []


def pass_through(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """Identity-like ops (Relu, Reshape, MaxPool, ...): no Q/DQ of their own. Quantization placed at a
    consumer further down commutes through them, so the runtime may move it across the op."""
    return []


@dataclass(frozen=True)
class Platform:
    """A named rule set: op_type → rule; ops absent from ``rules`` use ``keep_float``."""

    name: str
    rules: Mapping[str, Rule]

    def rule_for(self, node: onnx.NodeProto) -> Rule:
        if node.domain not in ("", "ai.onnx"):
            return keep_float
        return self.rules.get(node.op_type, keep_float)
