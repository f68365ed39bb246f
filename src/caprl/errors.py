"""User-facing errors: the CLI prints their message (no traceback) and exits 2."""


class CaprlError(Exception):
    """An error caused by the user's input (params, data files, checkpoints).

    The message must say which file/key/line is wrong and what to do about it.
    """
