"""User-facing errors: one line naming the file, the key and what to do."""

from __future__ import annotations

from typing import Any


class EdgeflError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits with code 2."""

    resumable = False  # the run it stopped can go on from its last checkpoint (the CLI says how)

    def __init__(self, where: str, key: str, fix: str) -> None:
        super().__init__(f"{where}: {key}: {fix}")
        self.where = where
        self.key = key
        self.fix = fix

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its fields, whatever its class's arguments (a Ray task's error comes back)."""
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[EdgeflError], args: tuple[Any, ...], fields: dict[str, Any]) -> EdgeflError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(fields)
    return error


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`), met as Ctrl-C is: the round in progress is abandoned,
    the last checkpoint stays."""


class NotARunError(EdgeflError):
    """A run folder edgefl cannot read as one: `problem` says what is wrong with it. The fix is to
    give a run directory edgefl run made, unless the caller knows a better one (`with_fix`: a
    comparison's own run, damaged since, is redone)."""

    FIX = "give a run directory made by edgefl run"

    def __init__(self, where: str, key: str, problem: str, fix: str = FIX) -> None:
        super().__init__(where, key, f"{problem}; {fix}")
        self.problem = problem

    def with_fix(self, fix: str) -> NotARunError:
        return NotARunError(self.where, self.key, self.problem, fix)
