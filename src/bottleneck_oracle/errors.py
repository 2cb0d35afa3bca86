"""Errors the library raises for bad input; the CLI turns them into one clean line."""

from __future__ import annotations

from pathlib import Path


class OracleError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""


class TraceError(OracleError):
    """A trace file is missing, corrupt, truncated, foreign or inconsistent."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(self.path, problem)  # both args, so the error survives pickling across processes

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


class GraphError(OracleError):
    """The events do not form a valid execution graph (e.g. a dependency cycle)."""


class ConfigError(OracleError):
    """A configuration file or value is wrong."""


class RunError(OracleError):
    """A job the tool launched (a recording's ranks) failed or was killed."""


def first_line(exc: BaseException, width: int = 120) -> str:
    """The first line of an exception's message, at most ``width`` characters ('' if it has none):
    what a one-line error quotes of a library's own error."""
    return (str(exc).splitlines() or [""])[0][:width]


class OracleWarning(UserWarning):
    """A partial or unusual input: the analysis goes on with what could be used."""
