"""Optional dependencies (the ``ray`` and ``udacity`` extras): the error that says which extra to install."""


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""
