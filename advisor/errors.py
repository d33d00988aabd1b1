"""User-facing errors: one line, no traceback, exit code 2 from the CLI."""


class AdvisorError(Exception):
    """Something the user can fix: the message is one plain line that says what and how."""

    exit_code = 2

    def __init__(self, message: str):
        # Keep it to one line whatever the cause carried (paths, SQL errors with newlines), and
        # printable: a file name or trace string with ANSI escapes, bidi overrides or bytes
        # that are not UTF-8 is shown escaped, never sent raw to the user's terminal.
        from .textutil import safe_text

        super().__init__(safe_text(" ".join(str(message).split()), limit=2000))


class TraceError(AdvisorError):
    """A trace file that cannot be read: missing, unknown format, truncated, corrupt, empty."""


class NoKernelsError(TraceError):
    """The trace was read but holds no GPU kernel activity."""
