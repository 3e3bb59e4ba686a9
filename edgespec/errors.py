"""The one exception type that carries a message meant for the user.

May import: nothing of edgespec.
"""


class EdgespecError(Exception):
    """A user-facing error: its message names the problem and the fix.

    The CLI prints it on one line and exits non-zero, without a traceback.
    """
