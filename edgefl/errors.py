"""User-facing errors: one line naming the file, the key and what to do."""

from __future__ import annotations


class EdgeflError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits with code 2."""

    def __init__(self, where: str, key: str, fix: str) -> None:
        super().__init__(f"{where}: {key}: {fix}")
        self.where = where
        self.key = key
        self.fix = fix


NOT_A_RUN = "give a run directory made by edgefl run"  # the fix for a run folder edgefl cannot read
