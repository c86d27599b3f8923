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

Steps relative to what each parameter is measured against (``relative_step``). Adam moves every
element by about its learning rate a step, whatever the element's magnitude, so one absolute rate cannot
suit a graph holding weights of 1e-4 beside weights of 1 (measured: one Adam step at lr 1e-5 took
ocr-det's loss from 0.086 to 1.13, where the narrow ResNet of ``bench.qat`` trained best at 3e-4).
After each Adam step, every parameter's change is multiplied by its own m (Adam's moments depend on
the gradients alone, so this is Adam with the learning rate lr·m per element):

- a weight or bias T: m = r_T, the root mean square of T's initial value per quantization channel (along
  the config's ``channel_axis`` for a per-channel weight of rank ≥ 2; over the whole tensor otherwise),
  so ``QatConfig.lr`` is a fraction of each channel's size. A channel whose initial value is all zero
  takes its tensor's RMS; an all-zero tensor (a bias initialised to zero) takes m = 1.
- a log-scale u of a grid with L = quant_max - quant_min steps: m = 1/L, so that ``scale_lr`` is how
  many quantization steps the grid's range L·s moves a step, at any bit width. A step of Δu moves the
  range by L·s·Δu: an absolute rate on u moves an 8-bit range 17 times as many steps as a 4-bit one
  (measured: the best absolute rate was 1e-3 on the narrow ResNet at W4A4, 1e-4 on ocr-det at INT8, both
  about 2e-2 steps of the range; ``bench/README.md``).
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
        # parameter name (``named_parameters``) → m, broadcastable to it: Adam's step multiplier (module docstring)
        self.step_sizes: dict[str, torch.Tensor] = {}
        for name, key in self.tensor_keys.items():
            self.step_sizes[f"tensors.{key}"] = _step_size(self.tensors[key].detach(), configs.get(name))
        scaled = {f"log_scales.{key}": configs[root] for root, key in self.scale_keys.items()}
        scaled |= {f"weight_log_scales.{key}": configs[name] for name, key in self.weight_scale_keys.items()}
        for parameter, tqc in scaled.items():
            self.step_sizes[parameter] = torch.tensor(1.0 / (tqc.quant_max - tqc.quant_min), device=device)

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

    def relative_step(self, previous: Mapping[str, torch.Tensor]) -> None:
        """After an optimizer step from the values ``previous`` (``state()``, taken before it): multiply each
        parameter's change by its m (module docstring)."""
        with torch.no_grad():
            for name, value in self.named_parameters():
                value.copy_(previous[name] + (value - previous[name]) * self.step_sizes[name])

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


def _step_size(value: torch.Tensor, tqc: TensorQuantConfig | None) -> torch.Tensor:
    """r_T of the module docstring: the RMS of ``value`` per channel of a per-channel weight config (the
    shape of ``value`` with 1 on every other axis), else over the whole tensor (a scalar); 1-D tensors
    (biases) always over the whole tensor, since one element of a bias can be near zero."""
    whole = value.square().mean().sqrt()
    whole = torch.where(whole > 0, whole, torch.ones_like(whole))
    if tqc is None or not tqc.per_channel or value.ndim < 2:  # a bias (C,) moves as a whole: its elements may be ~0
        return whole
    axis = tqc.channel_axis % value.ndim
    others = tuple(a for a in range(value.ndim) if a != axis)
    per_channel = value.square().mean(dim=others, keepdim=True).sqrt() if others else value.abs()
    return torch.where(per_channel > 0, per_channel, whole)


def graph_outputs(model: onnx.ModelProto, block: Block) -> list[str]:
    """The graph outputs the module computes, in the graph's order."""
    return [o.name for o in model.graph.output if o.name in block.outputs]
