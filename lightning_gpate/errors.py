"""Errors that are the user's input, not the program's fault.

The command line ends such an error with one line, ``lightning-gpate <command>: error: <message>``,
and exit code 2 (``--debug`` shows the traceback); anything else is a bug and keeps its traceback.
Raise a :class:`UserError` subclass (or a plain ``ValueError`` from a constructor's argument check)
with a message that names the bad input and says what to do instead.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a config value, a data file, a checkpoint, a spent budget. The message is shown
    to the user as it is, on one line."""


class OptionError(UserError, ValueError):
    """An option or config key the command line does not know, a value of the wrong type, a config file
    that is not there (:mod:`lightning_gpate.option_errors` words the message)."""


class ConfigError(UserError, ValueError):
    """A combination of options this program does not run (e.g. a model on several processes
    that trains on one only)."""


class BudgetExhaustedError(UserError, RuntimeError):
    """Training was asked of a model whose privacy budget is already spent."""


class NoPrivateStepError(BudgetExhaustedError):
    """The budget could not pay for a single training step: the generator would be untrained while the
    fit looked like a success (ε spent 0)."""
