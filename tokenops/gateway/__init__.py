"""The OpenAI-compatible gateway: FastAPI app, request pipeline, admin API, metrics.

``create_app`` is imported on first use, so the CLI's commands that only need a helper module
of this package (errors, keys) do not pay for importing FastAPI."""

__all__ = ["create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from tokenops.gateway.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
