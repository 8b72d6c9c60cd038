"""Client selection policies, registered by name (`selection.policy`): uniform, oort,
power_of_choice and memory_fit (see each module), and the server's record they read."""

from edgefl.selection import memory_fit, oort, power_of_choice, uniform  # noqa: F401  (register)
from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector

__all__ = ["SELECTORS", "Ask", "Known", "Picked", "Selector"]
