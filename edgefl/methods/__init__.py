"""Federated methods, one file each (Flower-style strategies), registered by name."""

from edgefl.methods import fedavg, fedcurv, feddyn, fedprophet, fedprox, gma, scaffold, sfat  # noqa: F401  (register)
from edgefl.methods import feddf as feddf  # register
from edgefl.methods import feddrop as feddrop  # register
from edgefl.methods import fedet as fedet  # register
from edgefl.methods import fedrolex as fedrolex  # register
from edgefl.methods import heterofl as heterofl  # register
from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context, Method

__all__ = ["METHODS", "ClientPlan", "ClientUpdate", "Context", "Method"]
