"""Stage 2, annotate: decide, by the platform's rules, which tensors are quantized and how.

Walks the prepared graph's nodes in order. A node stays float when the user excludes it (op type or an
fnmatch pattern over its name), when prepare marked it float (``PreparedModel.float_nodes``:
normalizations and powers written out, recurrent ops, control flow), or when it is an attention's
product with probabilities over more than ``LONG_ATTENTION`` positions and the platform quantizes
activations to integers (``quantcore.prepare.attention``; FP8 keeps them). Otherwise
``platform.rule_for(node)`` returns requests (``quantcore.annotate.rules``) for the node's inputs, outputs and
bias, with TQCs built from the platform's presets at the bits resolved for this node:

    bits = override.bits                  the first NodeOverride whose pattern matches the node
         | platform.boundary_bits         first/last compute layer (academic: 8)
         | precision.weight_bits / .activation_bits

and the activation observer from the first matching override, else the run's ``observer``. After the
walk, the tensors named in ``config.wide_tensors`` go to 16 bits (``quantcore.annotate.widening``).

A tensor read by several nodes gets one config and one Q/DQ pair shared by every annotated consumer.
When two rules want a tensor quantized differently, the first wins and the later consumer reads the
float tensor (recorded in ``warnings``). Every node's decision and its reason are recorded.

Quantization points are ONNX tensor names, the names the user sees in Netron.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import onnx

from quantcore.annotate.platforms import PLATFORMS
from quantcore.annotate.rules import (
    BiasRequest,
    FloatReason,
    Platform,
    QuantRequest,
    RuleContext,
    keep_float,
    pass_through,
)
from quantcore.annotate.widening import widen
from quantcore.config import QuantizeConfig
from quantcore.graph.index import SUBGRAPH_INPUT, GraphIndex
from quantcore.graph.ops import COMPUTE_OPS
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.prepare.attention import LONG_ATTENTION
from quantcore.prepare.preparation import PreparedModel

# Per-node decisions recorded in Annotation.decisions
QUANTIZED, PASS_THROUGH, FLOAT, EXCLUDED = "quantized", "pass_through", "float", "excluded"


@dataclass(frozen=True)
class NodeInput:
    """Input ``index`` of node ``node`` (by node name)."""

    node: str
    index: int


@dataclass(frozen=True)
class BiasLink:
    """A bias stored as int32: s_b = s(activation) · s(weight), offset 0, read by ``consumer``."""

    consumer: NodeInput
    activation: str
    weight: str


@dataclass(frozen=True)
class Annotation:
    """Tensor name → its quantization, plus the node inputs that read the quantized value.

    configs: every quantized tensor's TQC (state INITIAL before calibration, ACTIVATED/PASSIVE after).
    consumers: tensor → the node inputs rewired to its DequantizeLinear output on export.
    parameters: the subset of ``configs`` that are initializers (weights), stored quantized on export.
    biases: bias initializer → its int32 link (scale derived at export from the calibrated configs).
    decisions: node name → "quantized" | "pass_through" | "float" | "excluded"; reasons: why.
    notes: statements about this run: the platform's (e.g. the weight range chosen for the target CPU),
    calibration's (a batch split to bound memory).
    unsigned_weights: export int8 weight codes as uint8 with zero point + 128, the same grid, for
    kernels that read unsigned weights (``quantcore.runtime.cpu_features``).
    """

    configs: Mapping[str, TensorQuantConfig]
    consumers: Mapping[str, tuple[NodeInput, ...]]
    parameters: frozenset[str]
    decisions: Mapping[str, str]
    warnings: tuple[str, ...] = field(default=())
    reasons: Mapping[str, str] = field(default_factory=dict)
    biases: Mapping[str, BiasLink] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default=())
    platform: str | None = None
    unsigned_weights: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))
        object.__setattr__(self, "consumers", MappingProxyType({k: tuple(v) for k, v in self.consumers.items()}))
        object.__setattr__(self, "decisions", MappingProxyType(dict(self.decisions)))
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))
        object.__setattr__(self, "biases", MappingProxyType(dict(self.biases)))
        if set(self.consumers) != set(self.configs):
            raise ValueError("configs and consumers must name the same tensors")
        if not self.parameters <= set(self.configs):
            raise ValueError("parameters must be a subset of the annotated tensors")
        for name, link in self.biases.items():
            if link.activation not in self.configs or link.weight not in self.configs or name in self.configs:
                raise ValueError(f"bias {name!r} must link two annotated tensors and not be annotated itself")

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
        """Counts and every node's decision with its reason, for the report."""
        counts: dict[str, int] = {}
        for decision in self.decisions.values():
            counts[decision] = counts.get(decision, 0) + 1
        return {
            "platform": self.platform,
            "quantized_activations": len(self.activations),
            "quantized_weights": len(self.parameters),
            "quantized_biases": len(self.biases),
            "nodes": counts,
            "excluded_nodes": sorted(n for n, d in self.decisions.items() if d == EXCLUDED),
            "decisions": [
                {"node": node, "decision": decision, "reason": self.reasons.get(node, "")}
                for node, decision in self.decisions.items()
            ],
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }


def exclusion(node: onnx.NodeProto, config: QuantizeConfig) -> str | None:
    """Why the user keeps ``node`` float (op type or name pattern), None if they don't."""
    if node.op_type in config.exclude_op_types:
        return f"excluded by op type {node.op_type}"
    for pattern in config.exclude_node_patterns:
        if fnmatch.fnmatchcase(node.name, pattern):
            return f"excluded by node pattern {pattern!r}"
    return None


def is_excluded(node: onnx.NodeProto, config: QuantizeConfig) -> bool:
    """True when the node's op type or name matches the config's exclusions."""
    return exclusion(node, config) is not None


def boundary_layers(graph: onnx.GraphProto, config: QuantizeConfig) -> set[str]:
    """Names of the first and last compute node (Conv/ConvTranspose/Gemm/MatMul) not excluded."""
    compute = [n.name for n in graph.node if n.op_type in COMPUTE_OPS and not is_excluded(n, config)]
    return {compute[0], compute[-1]} if compute else set()


def node_settings(
    node: onnx.NodeProto, config: QuantizeConfig, platform: Platform, boundary: set[str]
) -> tuple[int, int, str, str]:
    """(weight bits, activation bits, observer, how they were chosen) for ``node``."""
    precision = config.precision_spec
    weight_bits, activation_bits, observer = precision.weight_bits, precision.activation_bits, config.observer
    how = []
    if platform.boundary_bits is not None and node.name in boundary:
        weight_bits = activation_bits = platform.boundary_bits
        how.append(f"first/last layer at {platform.boundary_bits} bit")
    bits_set = observer_set = False
    for override in config.overrides:
        if not override.matches(node.name):
            continue
        if override.bits is not None and not bits_set:
            weight_bits = activation_bits = override.bits
            bits_set = True
            how.append(f"{override.bits} bit by override {override.pattern!r}")
        if override.observer is not None and not observer_set:
            observer = override.observer
            observer_set = True
            how.append(f"observer {observer} by override {override.pattern!r}")
    return weight_bits, activation_bits, observer, "; ".join(how)


def _describe(requests: list[QuantRequest | BiasRequest], node: onnx.NodeProto) -> str:
    parts = []
    for request in requests:
        if isinstance(request, BiasRequest):
            parts.append(f"bias {node.input[request.index]} int32")
        elif request.output:
            parts.append(f"output {node.output[request.index]}")
        else:
            parts.append(f"input {node.input[request.index]}")
    return ", ".join(parts)


class _Builder:
    """Mutable state of one annotation walk."""

    def __init__(self, prepared: PreparedModel, config: QuantizeConfig) -> None:
        self.config = config
        self.graph = prepared.model.graph
        self.index = GraphIndex(self.graph)
        self.configs: dict[str, TensorQuantConfig] = {}
        self.consumers: dict[str, list[NodeInput]] = {}
        self.parameters: set[str] = set()
        self.decisions: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.biases: dict[str, BiasLink] = {}
        self.warnings: list[str] = []

    def excluded(self, node: onnx.NodeProto) -> bool:
        return is_excluded(node, self.config)

    def readers(self, name: str, float_nodes: Mapping[str, str]) -> list[NodeInput]:
        """Node inputs reading ``name`` that take its dequantized value: not excluded, not kept float by
        prepare, not an implicit use inside a subgraph."""
        return [
            NodeInput(node.name, position)
            for node, position in self.index.consumers.get(name, [])
            if position != SUBGRAPH_INPUT and not self.excluded(node) and node.name not in float_nodes
        ]

    def accept(self, node: onnx.NodeProto, name: str, tqc: TensorQuantConfig, uses: list[NodeInput], what: str) -> bool:
        existing = self.configs.get(name)
        if existing is not None and not existing.same_quantization(tqc):
            self.warnings.append(
                f"{node.name} {what} ({name}) left float: the tensor is already quantized differently "
                f"for another consumer"
            )
            return False
        self.configs.setdefault(name, tqc)
        known = self.consumers.setdefault(name, [])
        known.extend(use for use in uses if use not in known)
        if self.index.is_initializer(name):
            self.parameters.add(name)
        return True


def annotate(prepared: PreparedModel, config: QuantizeConfig) -> Annotation:
    """Annotate ``prepared`` for ``config.platform``; the graph is not modified."""
    platform = PLATFORMS[config.platform]
    state = _Builder(prepared, config)
    float_nodes = {**getattr(prepared, "float_nodes", {}), **long_attention(prepared, platform, config)}
    empty = getattr(prepared, "empty_tensors", frozenset())  # no element to take a range from: never quantized
    boundary = boundary_layers(state.graph, config) if platform.boundary_bits is not None else set()

    for node in state.graph.node:
        excluded = exclusion(node, config)
        if excluded is not None:
            state.decisions[node.name], state.reasons[node.name] = EXCLUDED, excluded
            continue
        if node.name in float_nodes:
            state.decisions[node.name], state.reasons[node.name] = FLOAT, float_nodes[node.name]
            continue
        rule = platform.rule_for(node)
        weight_bits, activation_bits, observer, how = node_settings(node, config, platform, boundary)
        context = RuleContext(
            index=state.index,
            config=config,
            weight_preset=platform.weight,
            activation_preset=platform.activation,
            weight_bits=weight_bits,
            activation_bits=activation_bits,
            observer=observer,
            annotated=lambda name: name in state.configs,
            config_of=lambda name: state.configs.get(name),
            decision_of=lambda name: state.decisions.get(name),
            excluded=state.excluded,
        )
        requests = rule(node, context)
        kept = next((r for r in requests if isinstance(r, FloatReason)), None)
        if kept is not None:
            state.decisions[node.name] = FLOAT
            state.reasons[node.name] = f"{platform.name} rule for {node.op_type}: {kept.reason}"
            continue
        accepted: list[QuantRequest | BiasRequest] = []
        for request in requests:
            if isinstance(request, BiasRequest):
                continue
            name = node.output[request.index] if request.output else node.input[request.index]
            if name in empty:
                continue
            if request.output:
                uses = state.readers(name, float_nodes)
                if uses and state.accept(node, name, request.config, uses, f"output {request.index}"):
                    accepted.append(request)
            else:
                if state.accept(node, name, request.config, [NodeInput(node.name, request.index)], "input"):
                    accepted.append(request)
        quantized_inputs = {node.input[r.index] for r in accepted if isinstance(r, QuantRequest) and not r.output}
        for request in requests:
            if not isinstance(request, BiasRequest):
                continue
            activation, weight = node.input[request.activation_index], node.input[request.weight_index]
            if {activation, weight} <= quantized_inputs and activation != weight:
                bias = node.input[request.index]
                state.biases[bias] = BiasLink(NodeInput(node.name, request.index), activation, weight)
                accepted.append(request)
        if accepted:
            state.decisions[node.name] = QUANTIZED
            state.reasons[node.name] = f"{platform.name} rule for {node.op_type}: {_describe(accepted, node)}" + (
                f" ({how})" if how else ""
            )
        elif rule is pass_through:
            state.decisions[node.name] = PASS_THROUGH
            state.reasons[node.name] = f"{node.op_type} is identity-like: quantization passes through it"
        elif rule is keep_float:
            state.decisions[node.name] = FLOAT
            state.reasons[node.name] = (
                f"custom-domain op {node.domain}.{node.op_type} stays float"
                if node.domain not in ("", "ai.onnx")
                else f"platform {platform.name} has no integer rule for {node.op_type}: stays float"
            )
        else:
            state.decisions[node.name] = FLOAT
            state.reasons[node.name] = (
                f"{platform.name} rule for {node.op_type} found nothing to quantize "
                f"(constant, non-float32 or unquantized operands)"
            )
    configs, biases, wide_notes, wide_warnings = widen(
        state.configs, frozenset(state.parameters), state.biases, config.wide_tensors
    )
    state.warnings.extend(wide_warnings)
    if not state.configs:
        state.warnings.append(
            f"platform {platform.name} found nothing to quantize in this model: the exported model computes in "
            "float (the report's node decisions say why, node by node)"
        )
    return Annotation(
        configs=configs,
        consumers=state.consumers,
        parameters=frozenset(state.parameters),
        decisions=state.decisions,
        warnings=tuple(state.warnings),
        reasons=state.reasons,
        biases=biases,
        notes=(*platform.notes(config), *wide_notes),
        platform=platform.name,
        unsigned_weights=platform.unsigned_weights(config),
    )


def long_attention(prepared: PreparedModel, platform: Platform, config: QuantizeConfig) -> dict[str, str]:
    """Node name → reason, for the attention products over more than ``LONG_ATTENTION`` positions that the
    platform's integer activations would quantize (``quantcore.prepare.attention``); none where it uses FP8."""
    if platform.activation(8, config.observer, config).floating:
        return {}
    return {
        name: f"attention probabilities over {positions} positions: one integer scale's steps would erase most "
        f"of them (kept float beyond {LONG_ATTENTION})"
        for name, positions in getattr(prepared, "attention_positions", {}).items()
        if positions > LONG_ATTENTION
    }
