"""edgefl: a memory-aware edge-device emulator for federated adversarial training.

SimPy plays the devices and keeps the simulated clock; real PyTorch training produces the models.
"""

__version__ = "0.1.0"
