"""Errors a user can cause. Each carries one sentence that names the setting to change.

Entry points (``train.py``, ``python -m mlmkit.*``) print the sentence and exit with
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
