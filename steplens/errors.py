"""The error every command answers with one line and a non-zero exit: bad flags, bad places, bad input."""


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""
