"""Federated methods, one file each, registered by name: client rules (what a selected client
trains, and how) and named pairs of a client rule with a server rule (edgefl.server).

Every module of this package is imported here, so a new method's file registers the method and its
knob section (edgefl.config.knob_section) with no other file to edit.
"""

from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context, Method
from edgefl.registry import import_folder

import_folder(__name__, __path__)

__all__ = ["METHODS", "ClientPlan", "ClientUpdate", "Context", "Method"]
