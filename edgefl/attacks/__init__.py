"""Attacks (torchattacks style: one small class each, the paper's defaults)."""

from edgefl.attacks import autoattack, cw, fgsm, pgd, pgd_l2  # noqa: F401  (register)
from edgefl.attacks.base import ATTACKS, Attack, make_attack

__all__ = ["ATTACKS", "Attack", "make_attack"]
