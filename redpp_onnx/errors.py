"""Errors a user can cause (bad paths, bad files, bad options): reported as one line, no traceback."""


class RedppError(Exception):
    """A problem with the user's input or options; the message says what and how to fix it."""


class VerificationFailed(RedppError):
    """The output model differs from the input more than the user allowed (``--max-rel-l2``)."""

    exit_code = 3
