"""Server rules, one file each (Flower's strategies), registered by name: how a round's client
updates become the next global model.

Every module of this package is imported here, so a new rule's file registers the rule and its knob
section (edgefl.config.knob_section) with no other file to edit. A scenario picks one with
`[server] rule = "NAME"` for any whole-model method (edgefl.methods.fedavg); each method names its
own (`fedavg_at`: mean, `fedyogi_at`: fedyogi, `gma`: gma, `sfat`: slack).
"""

from edgefl.registry import import_folder
from edgefl.server.base import RULES, ServerRule, State, Updates

import_folder(__name__, __path__)

__all__ = ["RULES", "ServerRule", "State", "Updates"]
