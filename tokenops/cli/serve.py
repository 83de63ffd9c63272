"""``tokenops serve``: the OpenAI-compatible gateway (bundled engine by default).

The options are module-level ``Annotated`` aliases so the command's signature reads as a list of
flags; the command applies them to the loaded settings and hands those to ``run_server``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tokenops.cli.options import ConfigOpt, StoreOpt

HostOpt = Annotated[str | None, typer.Option("--host", help="Address to bind (default 127.0.0.1).")]
PortOpt = Annotated[int | None, typer.Option("--port", "-p", help="Port (default 8000).")]
ModelsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help="[NAME=]PATH of a local HF model folder or GGUF file, or [NAME=]URL of an OpenAI-compatible "
        "server; repeatable; replaces \\[\\[models]].",
    ),
]
ServeAdminKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-key", help="Deprecated (any user sees it in ps): use TOKENOPS_ADMIN_KEY or --admin-key-file."
    ),
]
AdminKeyFileOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-key-file",
        help="File whose first line is the admin key (else TOKENOPS_ADMIN_KEY, [gateway] "
        "admin_key, or a generated key saved in the store folder).",
    ),
]
AllowOpenOpt = Annotated[
    bool, typer.Option("--allow-open", help="Serve non-loopback clients without API keys (otherwise refused).")
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Run without the DuckDB store (no telemetry).")]
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="uvicorn log level.")]
EngineProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--engine-profile",
        help="Start with a tuned engine profile: profiles/engines/NAME.toml from `tokenops tune` (or [engine] profile).",
    ),
]
OldProfileOpt = Annotated[str | None, typer.Option("--profile", hidden=True)]
LoraOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--lora",
        help="NAME=FOLDER: serve a PEFT LoRA adapter on the first local model as model NAME (repeatable; docs/lora.md).",
    ),
]
MaxLoadedOpt = Annotated[
    int | None,
    typer.Option(
        "--max-loaded-models",
        min=0,
        help="Bundled-engine models resident at once (0: all); the others load on demand, the least "
        "recently used idle one closed for room ([gateway] max_loaded_models; docs/serve.md).",
    ),
]


def serve_command(
    config: ConfigOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    model: ModelsOpt = None,
    store: StoreOpt = None,
    admin_key: ServeAdminKeyOpt = None,
    admin_key_file: AdminKeyFileOpt = None,
    allow_open: AllowOpenOpt = False,
    no_store: NoStoreOpt = False,
    log_level: LogLevelOpt = "warning",
    engine_profile: EngineProfileOpt = None,
    old_profile: OldProfileOpt = None,
    lora: LoraOpt = None,
    max_loaded_models: MaxLoadedOpt = None,
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/models, /metrics and /admin.

    With no arguments: the bundled engine on the embedded demo model, store under store/.
    Without \\[gateway] api_keys only loopback clients are served, and binding a
    non-loopback --host is refused unless --allow-open.
    """
    from tokenops.cli.serve_progress import StartProgress
    from tokenops.gateway.server import run_server

    if old_profile is not None:
        from tokenops.cli import UserError

        raise UserError(f"serve --profile is now --engine-profile: tokenops serve --engine-profile {old_profile}")
    settings = _settings(config, host, port, store, admin_key, admin_key_file, model, lora)
    if max_loaded_models is not None:
        settings.gateway.max_loaded_models = max_loaded_models
    startup_tunables = _engine_profile(settings, engine_profile or settings.engine.profile)
    run_server(
        settings,
        allow_open=allow_open,
        startup_tunables=startup_tunables,
        use_store=not no_store,
        log_level=log_level,
        echo=typer.echo,
        start_report=StartProgress(),  # loading, kernels compiling, loaded/failed, ready: on stderr
    )


def _settings(
    config: str | None,
    host: str | None,
    port: int | None,
    store: str | None,
    admin_key: str | None,
    admin_key_file: str | None,
    models: list[str] | None,
    loras: list[str] | None,
) -> Any:
    """The settings of ``config`` (checked for unknown plugin sections) with the flags laid over them:
    a flag the user gave wins over the file."""
    from tokenops.config import load_settings
    from tokenops.gateway.server import model_from_arg
    from tokenops.plugin_sections import check_plugin_sections

    settings = load_settings(config)
    check_plugin_sections(settings.plugins, settings.source or "settings")
    if host:
        settings.gateway.host = host
    if port is not None:
        settings.gateway.port = port
    if store:
        settings.store.path = store
    if admin_key_file:
        from tokenops.gateway.admin.admin_key import read_key_file

        settings.gateway.admin_key = read_key_file(admin_key_file)
    elif admin_key:
        typer.echo(
            "warning: --admin-key is visible to every user in ps; use TOKENOPS_ADMIN_KEY or --admin-key-file", err=True
        )
        settings.gateway.admin_key = admin_key
    if models:
        settings.models = [model_from_arg(m) for m in models]
    if loras:
        from tokenops.gateway.server import attach_lora_args

        attach_lora_args(settings, loras)
    return settings


def _engine_profile(settings: Any, profile_name: str | None) -> dict[str, Any] | None:
    """Lay the tuned profile ``profile_name`` over ``settings``; its tunables for the server to apply at
    start (None without a profile). A profile tuned for another model or machine is used with a warning."""
    if not profile_name:
        return None
    from tokenops.backends.registry import model_configs
    from tokenops.tune.engine_profile import apply_to_settings, load_profile, mismatches

    tuned = load_profile(profile_name)
    startup_tunables = apply_to_settings(tuned, settings)
    typer.echo(
        f"engine profile {tuned.name} ({tuned.path}): {', '.join(f'{k}={v}' for k, v in tuned.tunables.items())}"
    )
    for problem in mismatches(tuned, settings, [m.name for m in model_configs(settings)]):
        typer.echo(f"warning: engine profile {tuned.name} was {problem}; its values may not fit here", err=True)
    return startup_tunables


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
