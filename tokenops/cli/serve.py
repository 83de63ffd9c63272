"""``tokenops serve``: the OpenAI-compatible gateway (bundled engine by default)."""

from __future__ import annotations

from typing import Annotated

import typer

from tokenops.cli.options import ConfigOpt, StoreOpt


def serve_command(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", help="Port (default 8000).")] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="[NAME=]PATH of a local HF model folder or GGUF file, or [NAME=]URL of an OpenAI-compatible "
            "server; repeatable; replaces \\[\\[models]].",
        ),
    ] = None,
    store: StoreOpt = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            "--admin-key", help="Deprecated (any user sees it in ps): use TOKENOPS_ADMIN_KEY or --admin-key-file."
        ),
    ] = None,
    admin_key_file: Annotated[
        str | None,
        typer.Option(
            "--admin-key-file",
            help="File whose first line is the admin key (else TOKENOPS_ADMIN_KEY, [gateway] "
            "admin_key, or a generated key saved in the store folder).",
        ),
    ] = None,
    allow_open: Annotated[
        bool, typer.Option("--allow-open", help="Serve non-loopback clients without API keys (otherwise refused).")
    ] = False,
    no_store: Annotated[bool, typer.Option("--no-store", help="Run without the DuckDB store (no telemetry).")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    engine_profile: Annotated[
        str | None,
        typer.Option(
            "--engine-profile",
            help="Start with a tuned engine profile: profiles/engines/NAME.toml from `tokenops tune` "
            "(or [engine] profile).",
        ),
    ] = None,
    old_profile: Annotated[str | None, typer.Option("--profile", hidden=True)] = None,
    lora: Annotated[
        list[str] | None,
        typer.Option(
            "--lora",
            help="NAME=FOLDER: serve a PEFT LoRA adapter on the first local model as model NAME "
            "(repeatable; docs/lora.md).",
        ),
    ] = None,
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/models, /metrics and /admin.

    With no arguments: the bundled engine on the embedded demo model, store under store/.
    Without \\[gateway] api_keys only loopback clients are served, and binding a
    non-loopback --host is refused unless --allow-open.
    """
    from tokenops.config import load_settings
    from tokenops.gateway.server import model_from_arg, run_server

    if old_profile is not None:
        from tokenops.cli import UserError

        raise UserError(f"serve --profile is now --engine-profile: tokenops serve --engine-profile {old_profile}")
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
        from tokenops.gateway.admin_key import read_key_file

        settings.gateway.admin_key = read_key_file(admin_key_file)
    elif admin_key:
        typer.echo(
            "warning: --admin-key is visible to every user in ps; use TOKENOPS_ADMIN_KEY or --admin-key-file", err=True
        )
        settings.gateway.admin_key = admin_key
    if model:
        settings.models = [model_from_arg(m) for m in model]
    if lora:
        from tokenops.gateway.server import attach_lora_args

        attach_lora_args(settings, lora)
    startup_tunables = None
    profile_name = engine_profile or settings.engine.profile
    if profile_name:
        from tokenops.tune.engine_profile import apply_to_settings, load_profile, mismatches

        tuned = load_profile(profile_name)
        startup_tunables = apply_to_settings(tuned, settings)
        typer.echo(
            f"engine profile {tuned.name} ({tuned.path}): {', '.join(f'{k}={v}' for k, v in tuned.tunables.items())}"
        )
        from tokenops.backends.registry import model_configs

        for problem in mismatches(tuned, settings, [m.name for m in model_configs(settings)]):
            typer.echo(f"warning: engine profile {tuned.name} was {problem}; its values may not fit here", err=True)
    run_server(
        settings,
        allow_open=allow_open,
        startup_tunables=startup_tunables,
        use_store=not no_store,
        log_level=log_level,
        echo=typer.echo,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
