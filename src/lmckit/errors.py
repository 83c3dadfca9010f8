"""Exception hierarchy.

Every error lmckit raises on bad input is a subclass of :class:`LmcError`, so callers can
catch the library's complaints in one place. Each subclass also derives from the matching
built-in (``ValueError``, ``FileNotFoundError``) so generic handlers keep working.
"""

from __future__ import annotations


class LmcError(Exception):
    """Base class of every error lmckit raises about its inputs."""


class SpecError(LmcError, ValueError):
    """A :class:`~lmckit.perm.PermutationSpec` is malformed or does not fit a parameter dict."""


class PermutationError(LmcError, ValueError):
    """A permutation is malformed or does not fit its spec."""


class ParamsError(LmcError, ValueError):
    """Parameter dicts that cannot be used together (keys, shapes, dtypes, non-finite values)."""


class ModelConfigError(LmcError, ValueError):
    """A model name or configuration is invalid."""


class DataError(LmcError, ValueError):
    """A dataset file is missing, unreadable, corrupted or of the wrong format."""


class DatasetNotFoundError(DataError, FileNotFoundError):
    """A dataset was not found in any of the places lmckit looks."""


class CheckpointError(LmcError, ValueError):
    """A checkpoint or foreign weights file is unreadable, unsafe or does not fit its model."""


class TrainConfigError(LmcError, ValueError):
    """A training configuration is invalid."""


class LapError(LmcError, ValueError):
    """An assignment problem is malformed (not square, not finite)."""


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (a scheduler's time limit, ``kill``, ``timeout``) where
    lmckit handles it as Ctrl-C: work in flight stops, finished results are kept. The
    command line exits with status 143 (128 + SIGTERM)."""


class UsageError(LmcError, ValueError):
    """A request that cannot be carried out as asked: arguments out of range, paths of the
    wrong kind, or inputs that do not fit each other (a dataset that does not fit a
    checkpoint, one checkpoint given twice). The command line exits with status 2."""


class InputMisfitError(SpecError, UsageError):
    """Example inputs that do not run through the model they are meant to trace."""


class OutputPathError(UsageError):
    """An output path that cannot be written: a file where a folder is needed or the
    reverse, a path under a file, or no permission."""
