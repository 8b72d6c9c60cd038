"""Profiling: per-atom FLOPs (fvcore), parameters, activations, and the memory estimators."""

from edgefl.profiling.atoms import AtomProfile, ModelProfile, profile_model
from edgefl.profiling.memory import mem_req, optimizer_slots, paper_mem_req

__all__ = ["AtomProfile", "ModelProfile", "mem_req", "optimizer_slots", "paper_mem_req", "profile_model"]
