"""The ``tokenops`` command: a typer app with one module per command group."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer._click import Context  # typer (0.29) vendors click: TyperGroup's methods take this Context

from tokenops import __version__
from tokenops.errors import UserError


class _RootGroup(TyperGroup):
    """An unknown command while ``TOKENOPS_LOAD_PLUGINS`` leaves plugins out says that plugins
    add commands too (one line, instead of click's usage error)."""

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        allow = os.environ.get("TOKENOPS_LOAD_PLUGINS")
        if allow is not None and args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            loaded = "only the plugins it lists" if allow.strip() else "no plugin beyond the defaults"
            raise UserError(
                f"no command {args[0]!r}: plugins add commands too, and TOKENOPS_LOAD_PLUGINS={allow!r} "
                f"loads {loaded} (`tokenops plugins` shows what is loaded)"
            )
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_RootGroup,
    name="tokenops",
    help="Token operations: serve, benchmark, tune and watch LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes ``register(app)``; a module not yet present is skipped. Technique
# commands (``profile``, ``route``) come from their plugins through ``tokenops_register_commands``.
COMMAND_MODULES = (
    "plugins_cmd",
    "serve",
    "report",
    "bench",
    "tune",
    "dashboard",
    "models",
    "engine_profile",
    "moe",
    "keys",
    "lora",
    "batch_cmd",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tokenops {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    plugin: Annotated[list[str] | None, typer.Option("--plugin", help="Load a local plugin file (repeatable).")] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Token operations: serve, benchmark, tune and watch LLM inference."""
    from tokenops import plugin_manager as plugins

    for path in plugin or []:
        plugins.add_plugin_file(path)


def build_app() -> typer.Typer:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"tokenops.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"tokenops.cli.{name}":
                continue
            raise
        module.register(app)
    from tokenops.plugin_manager import get_plugin_manager

    get_plugin_manager().hook.tokenops_register_commands(app=app)
    return app


def _known_errors() -> tuple[type[BaseException], ...]:
    from tokenops.config import ConfigError
    from tokenops.plugin_manager import PluginLoadError
    from tokenops.slo import SLOError
    from tokenops.tunables import TunableError

    extra = []
    try:
        from tokenops.store import StoreError  # noqa: PLC0415

        extra.append(StoreError)
    except ImportError:
        pass
    return (UserError, ConfigError, PluginLoadError, SLOError, TunableError, FileNotFoundError, *extra)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: known errors become one line (``TOKENOPS_DEBUG=1`` shows tracebacks)."""
    known = _known_errors()
    try:
        from tokenops.engine.kernels.openmp_wait import apply_spin_setting

        apply_spin_setting()  # TOKENOPS_OMP_SPIN, before any command imports torch (and libgomp): see openmp_wait.py
        from tokenops.engine.kernels.switches import limit_torch_isa

        limit_torch_isa()  # TOKENOPS_CPU=avx2: PyTorch's own kernels too, before it is imported (switches.py)
        build_app()(args=argv, standalone_mode=True)
    except known as e:
        if os.environ.get("TOKENOPS_DEBUG"):
            raise
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
