"""The one exception type for bad user input: its message is a one-line, actionable error."""


class SymfusionError(Exception):
    """Raised for bad input (paths, configs, weights); the CLIs print it as one line and exit 2."""
