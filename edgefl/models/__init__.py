"""The model zoo, one family per file (timm-style registry): every model is an `AtomModel`, a
sequence of atoms.

Atoms are the units the cost model walks, the profiler measures and FedProphet partitions. Any
torchvision or timm model (`torchvision:NAME`, `timm:NAME`) is cut into atoms automatically
(edgefl.models.vision, edgefl.models.cut).
"""

from edgefl.models.base import MODELS, SCALABLE, AtomModel, ModelBuilder
from edgefl.models.build import build_model
from edgefl.registry import import_folder

import_folder(__name__, __path__)  # each family's file registers its models

__all__ = ["MODELS", "SCALABLE", "AtomModel", "ModelBuilder", "build_model"]
