"""The error an operator raises for inputs or attributes it cannot take."""


class OperatorError(ValueError):
    """A node's inputs or attributes that its operator cannot take."""
