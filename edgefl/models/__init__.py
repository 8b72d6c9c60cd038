"""The model zoo: every model is an `AtomModel`, a sequence of atoms (timm-style registry).

Atoms are the units the cost model walks, the profiler measures and FedProphet partitions.
"""

from edgefl.models import cnn, digits, mobilenet, nin, resnet, smallcnn, vgg  # noqa: F401  (register the families)
from edgefl.models.base import MODELS, AtomModel, ModelBuilder, build_model

__all__ = ["MODELS", "AtomModel", "ModelBuilder", "build_model"]
