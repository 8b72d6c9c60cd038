"""A run killed between writing a round's rows and saving its checkpoint, for the resume tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgefl import checkpoint


@contextmanager
def dies_before_checkpoint(next_round: int) -> Iterator[None]:
    """Within: a run raises KeyboardInterrupt (exit 130 from the CLI) where it would save the
    checkpoint whose `next_round` is `next_round`; the real save is back afterwards."""
    real = checkpoint.save

    def save(path: Path, state: dict[str, Any]) -> None:
        if state["next_round"] == next_round:
            raise KeyboardInterrupt
        real(path, state)

    checkpoint.save = save  # type: ignore[assignment]
    try:
        yield
    finally:
        checkpoint.save = real
