"""Attacks (torchattacks style: one small class each, the paper's defaults)."""

from edgefl.attacks.base import ATTACKS, Attack, make_attack
from edgefl.attacks import fgsm, pgd  # noqa: F401  (register)

__all__ = ["ATTACKS", "Attack", "make_attack"]
