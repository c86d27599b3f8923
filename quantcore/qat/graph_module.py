"""The whole prepared, annotated graph as a torch module to train: ``BlockModule`` over every node
(``blocks.whole_graph``), with the weights and biases as float parameters.

What the forward computes is what the exported QDQ model computes, with the same fake-quantize kernels
and TQC policies (``quantcore.numerics.fake_quant``): every annotated parameter W is read as
x̂ = fake_quantize(W, tqc, scale=s_W) and every annotated activation where the annotation says its
DequantizeLinear output is read (``BlockModule``). Gradients reach W straight through the rounding
(1 inside the grid's range, 0 where clipped). BatchNormalization is already folded into the Conv
weights by prepare, so there are no statistics to update or freeze.

Learned, with ``learn_scales``: s = s₀·exp(u) per scale (LSQ's gradient through the kernel; the log keeps
s > 0 and makes the Adam step relative), for every activation dominator root and weight whose config is a
static linear grid without a power-of-two constraint (``learnable_activation``).
Biases: the float initializer read as input 2 of a Conv, ConvTranspose or Gemm, trained in float (an
int32 bias is re-derived from the trained scales on export).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import torch
from torch import nn

from quantcore.annotate.annotation import Annotation
from quantcore.calibrate.calibration import dominator_root
from quantcore.graph.index import GraphIndex
from quantcore.numerics.fake_quant import fake_quantize_tensor
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from quantcore.reconstruction.blocks import Block
from quantcore.reconstruction.converter import BlockModule, learnable_activation

BIAS_OPS = frozenset({"Conv", "ConvTranspose", "Gemm"})


def _biases(block: Block, index: GraphIndex) -> list[str]:
    """Float initializers read as the bias (input 2) of a Conv, ConvTranspose or Gemm."""
    names = []
    for node in block.nodes:
        bias = node.input[2] if node.op_type in BIAS_OPS and len(node.input) > 2 else ""
        if bias and index.is_initializer(bias) and index.array(bias).dtype == np.float32:
            names.append(bias)
    return list(dict.fromkeys(names))


class GraphModule(BlockModule):
    """forward(inputs) → the graph's outputs (``block.outputs`` order), inputs {graph input: (B, ...)}.

    ``configs``: the calibrated configs (reconstruction's learned scales included); the graph's current
    weights are read from ``index``. ``learn_scales``: learn the scales the module docstring lists.
    """

    def __init__(
        self,
        block: Block,
        index: GraphIndex,
        annotation: Annotation,
        configs: Mapping[str, TensorQuantConfig],
        *,
        learn_scales: bool,
        device: torch.device,
    ) -> None:
        weights = {name: index.array(name).astype(np.float32) for name in block.weights}
        roots = {dominator_root(t, configs) for t in annotation.activations}
        learned = {r for r in roots if learnable_activation(configs[r])} if learn_scales else set()
        super().__init__(block, index, annotation, configs, weights, learn=set(), learned=learned, device=device)
        self.fixed.clear()  # every weight is read from ``self.tensors`` below, fake-quantized at each forward
        self.tensor_keys: dict[str, str] = {}
        self.tensors = nn.ParameterDict()
        for i, (name, value) in enumerate({**weights, **{b: index.array(b) for b in _biases(block, index)}}.items()):
            self.tensor_keys[name] = f"t{i}"
            self.tensors[f"t{i}"] = nn.Parameter(torch.from_numpy(np.array(value, np.float32)).to(device))
        self.weight_scale_keys: dict[str, str] = {}
        self.weight_log_scales = nn.ParameterDict()
        self.initial_weight_scales: dict[str, torch.Tensor] = {}
        for i, name in enumerate(block.weights):
            if learn_scales and learnable_activation(configs[name]):
                self.weight_scale_keys[name] = f"w{i}"
                initial = torch.tensor(np.asarray(configs[name].scale, np.float32), device=device)
                self.initial_weight_scales[name] = initial  # (C,) per channel, () per tensor
                self.weight_log_scales[f"w{i}"] = nn.Parameter(torch.zeros_like(initial))

    def weight_scale(self, name: str) -> torch.Tensor | None:
        """W's scale s₀·exp(u) when learned, else None (the config's own)."""
        key = self.weight_scale_keys.get(name)
        if key is None:
            return None
        return self.initial_weight_scales[name] * torch.exp(self.weight_log_scales[key])

    def learned_values(self) -> dict[str, torch.Tensor]:
        values = {}
        for name, key in self.tensor_keys.items():
            tensor = self.tensors[key]
            if name in self.block.weights:
                tensor = fake_quantize_tensor(tensor, self.configs[name], scale=self.weight_scale(name))
            values[name] = tensor
        return values

    def scale_parameters(self) -> list[nn.Parameter]:
        return [*self.log_scales.values(), *self.weight_log_scales.values()]

    def state(self) -> dict[str, torch.Tensor]:
        """A detached copy of every trained parameter (``load_state`` restores it)."""
        return {key: value.detach().clone() for key, value in self.named_parameters()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for key, value in self.named_parameters():
                value.copy_(state[key])

    def trained(self) -> tuple[dict[str, np.ndarray], dict[str, TensorQuantConfig]]:
        """(tensor values, configs) to write back: each weight as its grid values x̂ (float32, the stored
        codes recovered exactly by the exporter's QuantizeLinear, as reconstruction's are), each bias as
        trained, and the weight configs with their learned scales. Activation scales: ``learned_scales``."""
        with torch.no_grad():
            values = {name: v.detach().cpu().numpy().astype(np.float32) for name, v in self.learned_values().items()}
            configs = {}
            for name in self.weight_scale_keys:
                tqc = self.configs[name]
                scale = self.weight_scale(name).cpu().numpy().astype(np.float32).reshape(np.shape(tqc.scale))
                configs[name] = tqc.with_scale(scale, tqc.offset, state=QuantState.ACTIVATED)
        return values, configs


def graph_outputs(model: onnx.ModelProto, block: Block) -> list[str]:
    """The graph outputs the module computes, in the graph's order."""
    return [o.name for o in model.graph.output if o.name in block.outputs]
