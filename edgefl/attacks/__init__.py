"""Attacks (torchattacks style: one small class each, the paper's defaults)."""

from edgefl.attacks.base import ATTACKS, Attack, make_attack
from edgefl.registry import import_folder

import_folder(__name__, __path__)  # each attack's file registers it

__all__ = ["ATTACKS", "Attack", "make_attack"]
