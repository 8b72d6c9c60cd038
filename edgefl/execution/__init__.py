"""Executors: where the real local training runs (in-process here)."""
