"""A dry run made twice, for the tests that a run is seeded (same scenario and seed, same files)."""

from __future__ import annotations

from pathlib import Path

from edgefl.experiment import Experiment, prepare, run
from edgefl.scenario import Scenario


def dry_twice(s: Scenario, where: Path, out: Path, files: tuple[str, ...]) -> tuple[Experiment, list[str]]:
    """Dry runs of `s` (read from `where`) into out/a and out/b, each of `files` written the same by
    both: the second run's experiment and the texts of the files."""
    texts = []
    for name in ("a", "b"):
        exp = prepare(s, str(where), dry_run=True)
        run(exp, out / name, progress=False)
        texts.append([(out / name / f).read_text() for f in files])
    assert texts[0] == texts[1], "the same scenario and seed must give the same files"
    return exp, texts[0]
