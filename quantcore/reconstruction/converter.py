"""One block of the ONNX graph as a torch module that simulates its quantization, differentiably.

``BlockModule`` runs the block's nodes in graph order with ``torch_ops.OPS`` and inserts the
quantization the exported QDQ model will have, at the same places:

- a weight annotated as a parameter is an ``AdaRoundWeight`` (learned rounding) when it is learned in
  this block, otherwise its current value (already on its grid, or fake-quantized to nearest);
- an activation t is fake-quantized where ``annotation.consumers[t]`` says a node input reads its
  DequantizeLinear output, with t's scale: the dominator root's, learned as s = s₀·exp(u) when the root
  is in ``learned`` (LSQ gradient through ``fake_quantize_tensor``; the log keeps s > 0 and makes the
  Adam step relative);
- QDrop (``drop_prob`` p > 0, training only): each fake-quantized element is replaced by a float
  value with probability p: x ← where(r < p, x_ref, x̂) with r ~ U[0, 1) element-wise, drawn anew at
  every forward. x_ref is the FP32 model's value for a tensor the block computes from its inputs
  through weight-free ops alone (a block input itself; the pooled input of a classifier, ReduceMean →
  Q → Gemm; a MaxPool before a conv), as QDrop's code mixes each block's cached quantized and FP32
  inputs; it is the tensor's own unquantized value for every other quantized tensor of the block.

Each quantized tensor is quantized once per forward, shared by all its consumers, as one Q/DQ pair is
shared in the exported model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from quantcore.annotate.annotation import Annotation
from quantcore.calibrate.calibration import dominator_root
from quantcore.graph.index import GraphIndex
from quantcore.numerics.fake_quant import fake_quantize_tensor
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.reconstruction.adaround import AdaRoundWeight
from quantcore.reconstruction.blocks import Block
from quantcore.reconstruction.torch_ops import OPS, node_attributes


def learnable_weight(tqc: TensorQuantConfig) -> bool:
    """AdaRound applies to calibrated static linear grids (not FP8, not dynamic)."""
    return not tqc.floating and not tqc.dynamic and tqc.scale is not None


def learnable_activation(tqc: TensorQuantConfig) -> bool:
    return not tqc.floating and not tqc.dynamic and not tqc.power_of_2 and tqc.scale is not None


def _constant(index: GraphIndex, name: str, device: torch.device) -> torch.Tensor:
    value = index.array(name) if index.is_initializer(name) else _constant_node_value(index, name)
    value = np.asarray(value)
    if value.dtype == np.float64:
        value = value.astype(np.float32)
    return torch.from_numpy(np.array(value)).to(device)


def _constant_node_value(index: GraphIndex, name: str) -> np.ndarray:
    attribute = node_attributes(index.producers[name])
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attribute:
            value = attribute[key]
            return numpy_helper.to_array(value) if key == "value" else np.asarray(value)
    raise NotImplementedError(f"Constant {name!r} without a tensor or numeric value")


class BlockModule(nn.Module):
    """forward(inputs, fp_inputs) → the block's outputs (``block.outputs`` order).

    inputs: the quantized model's values of ``block.inputs`` (B, ...); fp_inputs: the FP32 model's,
    needed only when dropping. ``configs``: the current calibrated configs (learned scales included);
    ``weights``: current values of every parameter the block reads; ``learn``: the weights to learn
    here; ``learned``: dominator roots whose scale is learned here.
    """

    def __init__(
        self,
        block: Block,
        index: GraphIndex,
        annotation: Annotation,
        configs: Mapping[str, TensorQuantConfig],
        weights: Mapping[str, np.ndarray],
        *,
        learn: set[str],
        learned: set[str],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.block = block
        self.configs = configs
        self.device = device
        self.attrs = [node_attributes(node) for node in block.nodes]
        self.drop_prob = 0.0
        self.generator: torch.Generator | None = None
        names = {node.name for node in block.nodes}
        # (node position, input index) → quantized activation tensor read there
        self.points: dict[tuple[int, int], str] = {}
        position = {node.name: i for i, node in enumerate(block.nodes)}
        for tensor in annotation.activations:
            for use in annotation.consumers[tensor]:
                if use.node in names:
                    self.points[(position[use.node], use.index)] = tensor
        self.roots = {t: dominator_root(t, configs) for t in set(self.points.values())}
        self.adaround = nn.ModuleDict()
        self.weight_keys: dict[str, str] = {}
        self.fixed: dict[str, torch.Tensor] = {}
        for i, name in enumerate(block.weights):
            if name in learn:
                self.weight_keys[name] = f"w{i}"
                self.adaround[f"w{i}"] = AdaRoundWeight(weights[name], configs[name], device)
            else:
                value = torch.from_numpy(np.asarray(weights[name], np.float32)).to(device)
                self.fixed[name] = fake_quantize_tensor(value, configs[name]).detach()
        self.log_scales = nn.ParameterDict()
        self.scale_keys: dict[str, str] = {}
        self.initial_scales: dict[str, torch.Tensor] = {}
        for i, root in enumerate(sorted(set(self.roots.values()))):
            self.initial_scales[root] = torch.tensor(np.asarray(configs[root].scale, np.float32), device=device)
            if root in learned:
                self.scale_keys[root] = f"s{i}"
                self.log_scales[f"s{i}"] = nn.Parameter(torch.zeros_like(self.initial_scales[root]))
        self.constants: dict[str, torch.Tensor] = {}
        for node in block.nodes:
            for name in node.input:
                if name and name not in block.weights and index.is_constant(name):
                    self.constants[name] = _constant(index, name, device)

    def set_weight_mode(self, mode: str) -> None:
        for module in self.adaround.values():
            module.mode = mode

    def reset_scales(self) -> None:
        with torch.no_grad():
            for parameter in self.log_scales.values():
                parameter.zero_()

    def scale(self, root: str) -> torch.Tensor:
        key = self.scale_keys.get(root)
        if key is None:
            return self.initial_scales[root]
        return self.initial_scales[root] * torch.exp(self.log_scales[key])

    def learned_scales(self) -> dict[str, np.ndarray]:
        """Dominator root → its learned scale (float32, the config's shape)."""
        with torch.no_grad():
            return {root: self.scale(root).cpu().numpy().astype(np.float32) for root in self.scale_keys}

    def weight_values(self) -> dict[str, np.ndarray]:
        return {name: self.adaround[key].grid_values() for name, key in self.weight_keys.items()}

    def learned_values(self) -> dict[str, torch.Tensor]:
        """Tensor name → the value this forward reads for each learned graph tensor, in place of its
        fixed or constant value: here the AdaRound weights (``quantcore.qat`` learns weights and biases
        directly)."""
        return {name: self.adaround[key]() for name, key in self.weight_keys.items()}

    def regularizer(self, beta: float) -> torch.Tensor:
        return sum((m.regularizer(beta) for m in self.adaround.values()), torch.zeros((), device=self.device))

    def _quantized(self, tensor: str, value: torch.Tensor, reference: torch.Tensor | None) -> torch.Tensor:
        root = self.roots[tensor]
        quantized = fake_quantize_tensor(value, self.configs[tensor], scale=self.scale(root))
        if self.training and self.drop_prob > 0:
            keep_float = torch.rand(value.shape, generator=self.generator, device=value.device) < self.drop_prob
            quantized = torch.where(keep_float, value if reference is None else reference, quantized)
        return quantized

    def _fp_arguments(
        self, position: int, node: onnx.NodeProto, args: list, fp: Mapping[str, torch.Tensor]
    ) -> list | None:
        """The node's arguments with FP32 values, when it reads only tensors ``fp`` holds (unquantized) and
        constants: no weight, no quantized input; else None."""
        references = []
        for i, (name, arg) in enumerate(zip(node.input, args, strict=True)):
            if not name or name in self.constants:
                references.append(arg)
            elif (position, i) not in self.points and name in fp:
                references.append(fp[name])
            else:
                return None
        return references

    def forward(
        self, inputs: Mapping[str, torch.Tensor], fp_inputs: Mapping[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        env: dict[str, torch.Tensor] = dict(inputs)
        # the FP32 model's values of the block inputs, and of what weight-free ops compute from them alone
        fp = {} if fp_inputs is None or not self.training else {n: v for n, v in fp_inputs.items() if n in env}
        quantized: dict[str, torch.Tensor] = {}
        weights = self.learned_values()
        for position, node in enumerate(self.block.nodes):
            args: list[torch.Tensor | None] = []
            for i, name in enumerate(node.input):
                if not name:
                    args.append(None)
                elif (position, i) in self.points:
                    if name not in quantized:
                        quantized[name] = self._quantized(name, env[name], fp.get(name))
                    args.append(quantized[name])
                elif name in weights:
                    args.append(weights[name])
                elif name in self.fixed:
                    args.append(self.fixed[name])
                elif name in self.constants:
                    args.append(self.constants[name])
                else:
                    args.append(env[name])
            outputs = OPS[node.op_type](args, self.attrs[position])
            env.update(zip(node.output, outputs, strict=False))
            references = self._fp_arguments(position, node, args, fp) if fp else None
            if references is not None:
                fp.update(zip(node.output, OPS[node.op_type](references, self.attrs[position]), strict=False))
        return [env[name] for name in self.block.outputs]
