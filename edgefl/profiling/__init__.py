"""Profiling: measures a real model (fvcore FLOPs, parameters, activations) into the cost model's
records (edgefl.sim.records)."""

from edgefl.profiling.atoms import profile_model

__all__ = ["profile_model"]
