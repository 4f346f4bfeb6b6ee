"""The one error type users see.

A `UserError` is a problem with the user's input or environment (a bad config field, a missing file,
a malformed line, a bad word). The CLI prints its message on one line and exits with code 2; it never
shows a traceback. Messages name the file, the field or line, and the offending value.
"""

from __future__ import annotations


class UserError(Exception):
    """An input problem reported as one line and exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
