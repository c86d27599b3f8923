"""Wide tensors: the tensors of ``QuantizeConfig.wide_tensors`` quantized at 16 bits, after the rules.

Mixed precision (``quantcore.analysis.mixed_precision``) names the tensors of its most sensitive layers here,
so that every annotation of the run (the first, the parity remedy's, the placement's) keeps them wide. A
named weight is widened alone; a named activation with every tensor sharing its scale (the same
``dominator`` root: a MaxPool's output with its input, a residual Add's operands), so that the shared scale
stays one scale:

    num_bits → ``WIDE_BITS``, quant range the 16-bit default of the same policy (asymmetric uint8 [0, 255]
    → uint16 [0, 65535]; symmetric int8, or 7-bit [-64, 63] weights, → int16 [-32768, 32767]),

policy, axis, observer and dominator kept. A bias stored as int32 with scale s_x · s_w whose activation or
weight is widened stays float instead: s_x · s_w shrinks up to 256-fold per widened side, and
round(b / (s_x · s_w)) could pass the int32 range; the layer reading a 16-bit input runs in float anyway (no
integer kernel takes it). A named tensor the rules did not quantize is reported in the warnings, not
silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from quantcore.config.choices import WIDE_BITS
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:  # annotation.py calls widen: its types only
    from quantcore.annotate.annotation import BiasLink


def _root(name: str, configs: Mapping[str, TensorQuantConfig]) -> str:
    """The tensor whose scale ``name`` ends up sharing, following dominators."""
    seen = {name}
    while (dominator := configs[name].dominator) is not None and dominator in configs and dominator not in seen:
        seen.add(dominator)
        name = dominator
    return name


def widen(
    configs: Mapping[str, TensorQuantConfig],
    parameters: frozenset[str],
    biases: Mapping[str, BiasLink],
    names: tuple[str, ...],
) -> tuple[dict[str, TensorQuantConfig], dict[str, BiasLink], list[str], list[str]]:
    """(configs with ``names`` (activations with their scale groups) at 16 bits, biases without the links of
    widened tensors, notes, warnings), as the module says; ``names`` () changes nothing."""
    configs, biases = dict(configs), dict(biases)
    if not names:
        return configs, biases, [], []
    wanted = [name for name in names if name in configs]
    warnings = [
        f"wide_tensors: {name} is not quantized in this model: not widened" for name in names if name not in configs
    ]
    roots = {_root(name, configs) for name in wanted if name not in parameters}
    widened = [
        name
        for name in configs
        if (name in parameters and name in wanted) or (name not in parameters and _root(name, configs) in roots)
    ]
    for name in widened:
        configs[name] = replace(configs[name], num_bits=WIDE_BITS, quant_min=None, quant_max=None)
    floated = sorted(b for b, link in biases.items() if link.activation in widened or link.weight in widened)
    for bias in floated:
        del biases[bias]
    notes = [f"{WIDE_BITS}-bit tensors (mixed precision): {', '.join(widened)}"] if widened else []
    if floated:
        notes.append(f"biases kept float beside a {WIDE_BITS}-bit tensor: {', '.join(floated)}")
    return configs, biases, notes, warnings
