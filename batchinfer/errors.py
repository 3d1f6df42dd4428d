"""Errors the service raises for people: the CLI prints them as one line and exits non-zero."""

EXCERPT_CHARS = 300  # how much of a cause (or a whole message) any error echoes
VALUE_CHARS = 200  # how much of one bad value from a user a message echoes


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def shown(value) -> str:
    """A user's value as an error message echoes it: its repr (so NUL, newlines and markup stay inert), cut short.
    Only the part that shows is rendered: a 60,000-item list costs as much as a short one."""
    return excerpt(repr(_clipped(value)), VALUE_CHARS)


def _clipped(value, depth: int = 0):
    """value cut to what the first VALUE_CHARS characters of its repr show (each item takes at least one): its
    first VALUE_CHARS items, VALUE_CHARS + 2 characters of a string, VALUE_CHARS levels (repr never nests deeper)."""
    if depth >= VALUE_CHARS:
        return ...
    if isinstance(value, str) and len(value) > VALUE_CHARS + 2:
        # repr picks its quotes by the quotes the whole string holds: they go after the part that shows
        return value[:VALUE_CHARS + 2] + "".join(q for q in "'\"" if q in value)
    if type(value) in (list, tuple):  # exactly: a subclass (a namedtuple) is shown as it is
        return type(value)(_clipped(v, depth + 1) for v in value[:VALUE_CHARS])
    if type(value) is dict:
        return {k: _clipped(v, depth + 1) for k, v in list(value.items())[:VALUE_CHARS]}
    return value


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, bounded: how a retried fault is logged (no traceback)."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {excerpt(lines[0], 200) if lines else ''}"


class BatchInferError(Exception):
    """code and param: what the API answers with (batchinfer.error_codes); None: the handler's default."""

    exit_code = 1

    def __init__(self, message: str = "", code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.code, self.param = code, param


class JobNotFound(BatchInferError):
    exit_code = 3


class InvalidRequest(BatchInferError):
    """A request the service refuses: HTTP 400 with `code` and `param` (batchinfer.error_codes); without a code, the
    message's `code: ` prefix names it."""

    exit_code = 2


class TooManyActive(BatchInferError):
    """The owner already has as many unfinished batches as allowed: HTTP 429."""


class JobConflict(BatchInferError):
    """The job's state does not allow it (cancel a finished job): HTTP 409."""
