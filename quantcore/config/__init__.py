"""A run's configuration, one frozen dataclass per concern, each validating itself in ``__post_init__``
(a bad value raises ``ValueError`` naming the field):

- ``QuantizeConfig`` and ``NodeOverride`` (``run``): platform, precision, observer, exclusions and
  per-node choices, deployment, and the options below;
- ``AnalysisOptions`` and ``AccuracyTarget`` (``analysis``): the layer-wise analysis and the target mode;
- ``AutoOptions`` (``auto``): the budget, objective and candidates of ``strategy="auto"``;
- ``MixedPrecisionConfig`` (``mixed_precision``): the promotion of sensitive layers;
- ``ReconstructionConfig`` (``reconstruction``), ``QatConfig`` (``qat``) and ``WeightOnlyConfig`` (``weight_only``);
- the names a field is checked against (``choices``): platforms and the precisions each accepts, and the
  other choices' tuples.

The names below are the package's surface; its modules import each other, never from here.
"""

from quantcore.config.analysis import TARGET_METRICS, AccuracyTarget, AnalysisOptions
from quantcore.config.auto import AutoOptions
from quantcore.config.choices import (
    AUTO_CANDIDATES,
    PLATFORM_NAMES,
    PLATFORM_PRECISIONS,
    WEIGHT_ONLY_PLATFORM,
    PlatformName,
    accepts_precision,
    default_precision,
)
from quantcore.config.mixed_precision import MixedPrecisionConfig
from quantcore.config.qat import QatAugment, QatConfig
from quantcore.config.reconstruction import ReconstructionConfig
from quantcore.config.run import NodeOverride, QuantizeConfig
from quantcore.config.weight_only import WeightOnlyConfig

__all__ = [
    "AUTO_CANDIDATES",
    "PLATFORM_NAMES",
    "PLATFORM_PRECISIONS",
    "TARGET_METRICS",
    "WEIGHT_ONLY_PLATFORM",
    "AccuracyTarget",
    "AnalysisOptions",
    "AutoOptions",
    "MixedPrecisionConfig",
    "NodeOverride",
    "PlatformName",
    "QatAugment",
    "QatConfig",
    "QuantizeConfig",
    "ReconstructionConfig",
    "WeightOnlyConfig",
    "accepts_precision",
    "default_precision",
]
