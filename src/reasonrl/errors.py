"""The one base class of the errors a user can fix: bad params, data or model source, or a diverged run.

Stage scripts print such an error as one ``error: ...`` line and exit with status 2 (:func:`reasonrl.cli.run_stage`).
Each module raises its own subclass; this module imports nothing, so catching them loads nothing.
"""


class UserError(Exception):
    """A problem in what the user gave the pipeline; the message names the file, line or dotted parameter."""


class ConfigError(UserError, ValueError):
    """A parameter is missing, unknown, mistyped or out of range; the message names it."""
