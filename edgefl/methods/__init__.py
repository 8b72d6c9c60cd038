"""Federated methods, one file each (Flower-style strategies), registered by name.

Every module of this package is imported here, so a new method's file registers the method and its
knob section (edgefl.config.knob_section) with no other file to edit.
"""

import importlib
import pkgutil

from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context, Method

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "ClientPlan", "ClientUpdate", "Context", "Method"]
