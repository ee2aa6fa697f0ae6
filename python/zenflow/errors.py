"""Errors raised by the zenflow package."""


class ZenFlowError(Exception):
    """A call to zenflowd (or the worker engine) failed.

    ``code`` is the gRPC status code's name ("UNAVAILABLE", "INVALID_ARGUMENT",
    ...), ``message`` what the daemon or the engine said.
    """

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
