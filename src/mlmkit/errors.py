"""Errors a user can cause. Each carries one sentence that names the setting to change.

Entry points (``train.py``, ``python -m mlmkit <command>``) print the sentence and exit with
status 2 instead of showing a traceback.
"""

from __future__ import annotations


class MLMKitError(Exception):
    """A problem with the user's settings or inputs, not a bug in mlmkit."""


class ConfigError(MLMKitError):
    """A config value is invalid."""


class DataError(MLMKitError):
    """The corpus cannot be read or yields nothing to train on."""


class TokenizerError(MLMKitError):
    """The tokenizer cannot be loaded or lacks a token BERT needs."""


class CheckpointError(MLMKitError):
    """A checkpoint cannot be found or loaded."""


class TrainingDiverged(MLMKitError):
    """Several optimizer steps in a row had a non-finite loss or gradient."""


class Preempted(MLMKitError):
    """A signal (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) stopped the run after a checkpoint was saved."""

    exit_code = 75  # EX_TEMPFAIL: try again (train.resume=auto continues the run)

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum  # the signal that stopped the run


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message without its full stop (its type's name where
    it has none): the part of a library's error worth quoting in one sentence."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__).rstrip(".")
