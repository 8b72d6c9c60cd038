"""edgefl for Flower: a Flower app's nodes as devices of an edgefl fleet, its rounds on edgefl's clock.

* `device_time()`: a client mod (`ClientApp(mods=[device_time()])`) that prices each node's train
  reply on its device with edgefl's cost model (edgefl.flower.mod);
* `DeviceClock(strategy, scenario=...)`: a strategy wrapper keeping the simulated clock, deciding
  with edgefl who trains and whose update counts, and writing edgefl's run folder
  (edgefl.flower.strategy).

Needs Flower: `pip install 'edgefl[flower]'`. docs/flower.md is the guide.
"""

try:
    import flwr  # noqa: F401
except ImportError:
    raise ImportError("edgefl.flower needs Flower (flwr), which is not installed: "
                      "pip install 'edgefl[flower]'") from None

from edgefl.flower.mod import device_time
from edgefl.flower.shadow import Shadow
from edgefl.flower.strategy import DeviceClock

__all__ = ["DeviceClock", "Shadow", "device_time"]
