"""The architecture's layering: the simulator (edgefl.sim) runs without PyTorch or fvcore, which
only the code that measures and trains real models imports."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import edgefl.sim


def test_no_sim_module_imports_torch_or_fvcore() -> None:
    names = sorted(f"edgefl.sim.{m.name}" for m in pkgutil.iter_modules(edgefl.sim.__path__))
    assert {"edgefl.sim.records", "edgefl.sim.cost", "edgefl.sim.engine"} <= set(names)
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'fvcore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
