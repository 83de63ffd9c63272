"""The tuner's one error type, importable without the load generator."""


class TuneError(RuntimeError):
    """Tuning cannot go on (server unreachable, admin key refused, engine failed to launch); one-line message."""
