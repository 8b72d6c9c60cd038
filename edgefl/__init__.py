"""edgefl: a memory-aware edge-device emulator for federated adversarial training.

A cost model prices each client's round and a compiled event loop plays what is event-ordered; SimPy
keeps the simulated clock (docs/time.md says which does what); real PyTorch training produces the models.
`edgefl.run` and `edgefl.compare` are the library's calls (edgefl.api), those the command line makes.
"""

from __future__ import annotations

from edgefl.version import __version__

TYPE_CHECKING = False  # typing's own costs an import; type checkers read this name alike
if TYPE_CHECKING:
    from edgefl.api import Comparison, RunResult, compare, run

__all__ = ["Comparison", "RunResult", "__version__", "compare", "run"]


def __getattr__(name: str) -> object:
    """edgefl.run, edgefl.compare and their results, loaded on first use (PEP 562): `import edgefl`
    loads nothing else."""
    if name in __all__:
        from edgefl import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgefl' has no attribute {name!r}")
