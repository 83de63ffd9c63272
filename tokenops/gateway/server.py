"""Running the gateway under uvicorn: store and telemetry sink, admin key, the
open-server rule, graceful shutdown (drain in-flight requests, flush telemetry)."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from tokenops.config import ConfigError, ModelConfig, Settings
from tokenops.gateway.admin.admin_key import admin_key_notice, secure_store_files
from tokenops.gateway.auth import is_loopback, resolve_admin_key

log = logging.getLogger("tokenops.gateway")


def model_from_arg(value: str, name: str | None = None) -> ModelConfig:
    """``--model``: ``[NAME=]PATH`` (a local HF folder or GGUF file) or ``[NAME=]URL`` (an OpenAI-compatible server)."""
    if "=" in value.split("://", 1)[0]:
        name, value = value.split("=", 1)
    if value.startswith(("http://", "https://")):
        served = name or _first_upstream_model(value)
        return ModelConfig(name=served, backend="openai", url=value)
    path = Path(value).expanduser()
    if path.is_file():
        from tokenops.engine.gguf.gguf_reader import is_gguf

        if not is_gguf(path):
            raise ConfigError(f"--model {value}: a file but not a GGUF model (a .gguf file, a model folder or a URL)")
        return ModelConfig(name=name or path.resolve().stem, backend="local", path=str(path))
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"--model {value}: not a model folder (no config.json), not a GGUF file and not an http(s) URL"
        )
    return ModelConfig(name=name or path.resolve().name, backend="local", path=str(path))


def attach_lora_args(settings: Any, values: list[str]) -> None:
    """``--lora NAME=FOLDER``: adapters on the first local model (the configured or default ones)."""
    from tokenops.backends.registry import model_configs

    settings.models = model_configs(settings)
    base = next((m for m in settings.models if m.backend == "local"), None)
    if base is None:
        raise ConfigError("--lora needs a local model (the bundled engine) to serve the adapter on")
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--lora {value}: expected NAME=FOLDER (a PEFT adapter folder)")
        if name == base.name:
            raise ConfigError(f"--lora {value}: the adapter cannot have the base model's name")
        base.lora[name] = path


def _first_upstream_model(url: str) -> str:
    import httpx

    from tokenops.backends.openai_http import base_url

    try:
        data = httpx.get(base_url(url) + "/models", timeout=5.0).json()
        return data["data"][0]["id"]
    except Exception as e:
        raise ConfigError(
            f"--model {url}: could not list its models ({type(e).__name__}); name it explicitly: --model NAME=URL"
        ) from None


def _num_managed_keys(settings: Settings) -> int:
    """Managed keys (``tokenops keys``) in the store file, before the server opens it."""
    path = Path(settings.store.path).expanduser()
    if not path.is_file():
        return 0
    import duckdb

    try:
        with duckdb.connect(str(path), read_only=True) as con:
            row = con.execute("SELECT count(*) FROM api_keys").fetchone()
            assert row is not None  # count(*) always returns one row
            return row[0]
    except duckdb.Error:  # an older schema, or a file another process holds: no keys to count
        return 0


def check_exposure(settings: Settings, allow_open: bool, num_managed_keys: int = 0) -> None:
    """Refuse to serve a non-loopback address without API keys (configured, or managed keys in
    the store) unless ``allow_open``."""
    if settings.gateway.api_keys or num_managed_keys or allow_open or is_loopback(settings.gateway.host):
        return
    raise ConfigError(
        f"refusing to serve {settings.gateway.host} without API keys: add [gateway] api_keys "
        "to tokenops.toml, bind 127.0.0.1, or pass --allow-open"
    )


def open_store(settings: Settings) -> tuple[Any, Any]:
    """Open the store and attach its writer to the DuckDB sink; returns (store, writer)."""
    from tokenops.store import Store, StoreError, sink

    try:
        store = Store.open(settings.store.path)
    except StoreError:
        from tokenops.store.remote import connect_server

        other = connect_server(settings.store.path)
        if other is None:
            raise
        with other:
            info = other.server_info
        raise StoreError(
            f"{settings.store.path} is already served by `tokenops serve` at {info.get('url')} "
            f"(PID {info.get('pid')}); use that server, stop it, or give this one --store "
            "elsewhere"
        ) from None
    secure_store_files(settings.store.path)  # created before this process, possibly world-readable
    writer = store.writer(flush_interval_s=min(settings.store.flush_interval_s, 1.0))
    sink.attach(writer)
    return store, writer


def start_store_channel(store: Any, gw: Any, url: str) -> Any:
    """Serve the store (and live tunables) to local CLI processes of this user
    (:mod:`tokenops.store.channel`); a channel that cannot start is logged, not fatal."""
    from tokenops.gateway.admin.admin import _tunables_list, apply_tunables
    from tokenops.store.channel import StoreChannel

    channel = StoreChannel(store)
    for wildcard in ("//0.0.0.0:", "//[::]:"):  # local clients reach a wildcard bind on loopback
        url = url.replace(wildcard, "//127.0.0.1:")
    from tokenops.gateway.admin.admin import deployment_facts

    channel.publish(
        url=url, models=list(gw.replicas), profile=getattr(gw.settings.engine, "profile", None), **deployment_facts(gw)
    )
    channel.register("tunables", lambda _msg: _tunables_list(gw))
    channel.register("set_tunables", lambda msg: apply_tunables(gw, msg["values"], str(msg.get("actor") or "local")))
    from tokenops.store import distill_pairs

    channel.register(distill_pairs.CHANNEL_OP, distill_pairs.channel_op(store))
    try:
        return channel.start()
    except OSError as e:
        log.warning(
            "store channel %s not started (%s); CLI commands cannot read the store while this server runs",
            channel.path,
            e,
        )
        return None


def _echo_start(gw: Any, url: str, key_notice: str, allow_open: bool, echo: Any) -> None:
    """What starts, where the admin key is, which API keys hold: the lines before the models load."""
    settings = gw.settings
    # the "serving" line waits until the models answer (announce_when_serving); this one says what loads
    echo(f"tokenops starting at {url}: {', '.join(gw.replicas)} (GET {url}/ready is 200 once they can answer)")
    if not settings.gateway.admin_key and not settings.gateway.admin_key_hash:
        echo(key_notice)  # the file's path, never the key
    num_managed = len(gw.keys.registry.keys())
    if settings.gateway.api_keys or num_managed:
        echo(f"API keys: {len(settings.gateway.api_keys)} configured, {num_managed} managed (tokenops keys)")
    else:
        echo(
            "API keys: none configured; serving loopback clients only"
            if not allow_open
            else "API keys: none configured; OPEN to every client (--allow-open)"
        )
    sys.stdout.flush()


def announce_when_serving(server: Any, gw: Any, url: str, echo: Any) -> Any:
    """``gw.on_started``: once the port is bound too (a fast start can beat uvicorn's bind), tell
    the start report and echo the "tokenops serving" line naming the models that can answer."""
    import asyncio

    from tokenops.gateway.openai.model_routes import model_status

    tasks: set[asyncio.Task[None]] = set()

    async def announce() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.02)
        if server.should_exit:
            return
        serving = [m for m in gw.replicas if model_status(gw, m) == "ready"]
        if gw.start_report is not None and hasattr(gw.start_report, "ready"):
            gw.start_report.ready(serving)
        echo(f"tokenops serving {', '.join(serving)} at {url}/v1  (metrics {url}/metrics, admin {url}/admin)")
        sys.stdout.flush()

    def on_started() -> None:
        task = asyncio.get_running_loop().create_task(announce())
        tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(tasks.discard)

    return on_started


def _exit_cleanly_on_sigterm() -> None:
    """uvicorn re-raises the signal that stopped it once it has drained; make that a
    normal exit, so the store below is still flushed and closed (SIGINT stays 130)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def _drain_on_signal(server: Any, gw: Any) -> None:
    """SIGTERM/SIGINT start the gateway's drain at once (new and queued requests get 503, /ready
    says so) and give uvicorn the drain's deadline (``[gateway] drain_timeout_s``, live) as its
    graceful-shutdown timeout, past which it cancels the requests still running."""
    handle_exit = server.handle_exit

    def on_signal(sig: int, frame: Any) -> None:
        if not server.should_exit:
            server.config.timeout_graceful_shutdown = math.ceil(gw.begin_drain())
        handle_exit(sig, frame)

    server.handle_exit = on_signal


def run_server(
    settings: Settings,
    *,
    allow_open: bool = False,
    use_store: bool = True,
    log_level: str = "warning",
    echo=print,
    startup_tunables: dict[str, Any] | None = None,
    start_report: Any = None,
) -> None:
    """Serve until SIGINT/SIGTERM; then drain, stop the engines and flush telemetry. When every
    configured model fails to load, stop at once and raise :class:`ConfigError` naming the cause
    (the CLI prints it as one line and exits non-zero). ``start_report`` hears each model's start
    (:class:`tokenops.gateway.core.model_loading.StartReport`, plus ``ready(models)`` and ``detach()``);
    "tokenops serving ..." is echoed once the models are loaded and the port answers."""
    import uvicorn

    from tokenops.gateway.app import create_app
    from tokenops.gateway.edge.http_protocol import uvicorn_limits

    check_exposure(settings, allow_open, _num_managed_keys(settings) if use_store else 0)
    os.umask(0o077)  # store, WAL, admin key file: readable by this user only
    store = writer = channel = None
    if use_store:
        store, writer = open_store(settings)
    try:
        store_dir = Path(settings.store.path).expanduser().parent if use_store else None
        key_hash, new_key = resolve_admin_key(settings.gateway.admin_key, settings.gateway.admin_key_hash, store_dir)
        app = create_app(
            settings,
            store=store,
            admin_key_hash=key_hash,
            allow_open=allow_open,
            drain_timeout_s=settings.gateway.drain_timeout_s,
        )
        gw = app.state.gateway
        gw.freezes_heap = True  # a long-lived process: see Gateway.start
        url = f"http://{settings.gateway.host}:{settings.gateway.port}"
        if store is not None:
            channel = start_store_channel(store, gw, url)
        if startup_tunables:  # a profile's live tunables beyond [engine]/[gateway]
            from tokenops.gateway.admin.admin import apply_when_ready

            apply_when_ready(gw, startup_tunables, actor=f"profile {settings.engine.profile}")
        _echo_start(gw, url, admin_key_notice(store_dir, new_key is not None), allow_open, echo)
        config = uvicorn.Config(
            app,
            host=settings.gateway.host,
            port=settings.gateway.port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(settings.gateway.drain_timeout_s),  # then it cancels streams
            lifespan="on",
            **uvicorn_limits(settings.gateway),
        )
        _exit_cleanly_on_sigterm()
        server = uvicorn.Server(config)
        _drain_on_signal(server, gw)
        # every configured model failed to load: stop rather than answer /health with nothing to serve
        gw.on_nothing_to_serve = lambda _cause: setattr(server, "should_exit", True)
        gw.start_report = start_report
        gw.on_started = announce_when_serving(server, gw, url, echo)
        server.run()
        if gw.start_failure is not None:
            raise ConfigError(gw.start_failure)
    finally:
        if start_report is not None and hasattr(start_report, "detach"):
            start_report.detach()  # a progress display stops before the last line is printed
        if channel is not None:
            channel.close()
        if store is not None:
            from tokenops.store import sink

            sink.detach()
            store.close()  # flushes and stops the writer
