"""Client selection policies, one file each, registered by name (`selection.policy`): uniform, oort,
power_of_choice and memory_fit (see each module), and the server's record they read."""

from edgefl.registry import import_folder
from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector

import_folder(__name__, __path__)  # each policy's file registers it (and its knob section)

__all__ = ["SELECTORS", "Ask", "Known", "Picked", "Selector"]
