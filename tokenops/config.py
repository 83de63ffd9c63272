"""Settings: ``tokenops.toml`` (stdlib ``tomllib``) with ``TOKENOPS_*`` environment
overrides. Every value has a default, so no file is needed.

Environment overrides use double underscores for nesting:
``TOKENOPS_GATEWAY__PORT=9000``, ``TOKENOPS_ENGINE__MAX_NUM_SEQS=64``; the short
forms ``TOKENOPS_STORE``, ``TOKENOPS_CONFIG`` and ``TOKENOPS_ADMIN_KEY`` are also read.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenops.batch_settings import BatchSettings
from tokenops.lora_settings import LoraSettings
from tokenops.shared_settings import SharedSettings
from tokenops.slo import SLO, parse_slos

#: Built-in plugin names the operator lets another plugin take: ``[plugins] replace`` of every
#: loaded configuration and ``tokenops.plugin_manager.allow_replacing``. Kept here, below the plugin
#: manager, which reads it when it loads (``tokenops.plugin_manager.replacements``).
replaceable_plugins: set[str] = set()


class ConfigError(ValueError):
    """Invalid configuration; the message names the file/variable and the key."""


@dataclass(slots=True)
class ModelConfig:
    """One ``[[models]]`` entry. ``replicas`` > 1 or several ``urls`` make replicas."""

    name: str
    backend: str = "local"  # local | openai | a plugin-registered kind
    path: str | None = None  # local HF folder or hub id (local backend)
    url: str | None = None  # base URL (openai backend)
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    served_model: str | None = None  # model name to send upstream (defaults to name)
    replicas: int = 1
    cost_input_per_1m: float = 0.0
    cost_output_per_1m: float = 0.0
    tags: list[str] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)  # per-model engine overrides
    timeout_s: float = 600.0
    max_retries: int = 2
    #: Bundled engine: the format the model writes tool calls in (tokenops/backends/tool_parsers.py);
    #: "auto": the one its chat template renders calls in (tokenops/backends/tool_format.py).
    tool_call_parser: str = "auto"
    #: Bundled engine: a free call (``tool_choice`` auto) whose name or first argument-value tokens the
    #: model chose with a lower probability is answered again in text (tokenops/backends/tool_confidence.py);
    #: 0 turns the gate off; unset: the measured default for a native tool format, off for the generic one.
    tool_call_min_confidence: float | None = None
    #: Bundled engine: how the model marks its thinking (tokenops/backends/reasoning_parsers.py):
    #: "think" sends <think>…</think> as reasoning_content. None: no reasoning parser.
    reasoning_parser: str | None = None
    #: Bundled engine: LoRA adapters served on this model, name -> PEFT adapter folder
    #: (tokenops/engine/lora/lora_adapters.py); each name is a model of its own in every endpoint.
    lora: dict[str, str] = field(default_factory=dict)
    #: Bundled engine: LoRA adapters held in memory at once (0: all); the least recently used one
    #: is unloaded to make room and reloaded from its folder when asked again.
    max_loras: int = 0
    #: Upstream engines (backend "openai"): send vLLM's ``priority`` = 1 with batch lines (the
    #: upstream must accept the field: vLLM with --scheduling-policy priority), and hold batch lines
    #: to this many in flight while interactive requests are (0: no bound).
    priority_field: bool = False
    batch_max_in_flight_upstream: int = 0
    #: ... and hold batch lines while the upstream's /metrics shows requests waiting there
    #: (tokenops/backends/upstream_queue.py).
    batch_upstream_queue: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("[[models]] entry without a name")
        for flag in ("priority_field", "batch_upstream_queue"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"model {self.name!r}: {flag} must be true or false")
        limit = self.batch_max_in_flight_upstream
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(
                f"model {self.name!r}: batch_max_in_flight_upstream must be an integer >= 0 (0: no bound), "
                f"not {limit!r}"
            )
        if not isinstance(self.lora, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.lora.items()
        ):
            raise ConfigError(f'model {self.name!r}: lora must be a table of adapter name = "folder"')
        if self.lora and self.backend != "local":
            raise ConfigError(f"model {self.name!r}: lora adapters need backend 'local' (the bundled engine)")
        if not isinstance(self.max_loras, int) or self.max_loras < 0:
            raise ConfigError(f"model {self.name!r}: max_loras must be an integer >= 0 (0: no bound)")
        if self.name in self.lora:
            raise ConfigError(f"model {self.name!r}: a lora adapter cannot have the base model's name")
        if self.backend == "openai" and not (self.url or self.urls):
            raise ConfigError(f"model {self.name!r}: backend 'openai' needs url or urls")
        conf = self.tool_call_min_confidence
        if conf is not None and (isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 <= conf <= 1):
            raise ConfigError(f"model {self.name!r}: tool_call_min_confidence must be a number from 0 to 1 (0: off)")
        if self.replicas < 1:
            raise ConfigError(f"model {self.name!r}: replicas must be >= 1")


@dataclass(slots=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 8000
    admin_key: str | None = None
    admin_key_hash: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict)  # key or sha256:hash -> tenant
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout_s: float = 600.0
    default_max_tokens: int = 256
    # hardening (docs/hardening.md): Host names a keyless server answers, slow-client
    # timeouts, connection bounds, cheap limits checked before any parsing work
    allowed_hosts: list[str] = field(default_factory=lambda: ["localhost", "127.0.0.1", "::1"])
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 4096
    max_connections_per_client: int = 256
    max_messages: int = 10000
    # stored /v1/responses state (tokenops/store/stored_responses.py): one response's row, and a
    # previous_response_id chain's rows together; a turn past either is a 400
    max_stored_response_bytes: int = 1024 * 1024
    max_chain_bytes: int = 16 * 1024 * 1024
    # what a request's JSON schemas may force or hold (tokenops/gateway/edge/schema_budget.py)
    schema_max_output_chars: int = 65536
    schema_max_nodes: int = 10000
    schema_max_depth: int = 64
    schema_max_enum_values: int = 2000
    # /metrics behind a key when API keys exist (tokenops/gateway/observability/metrics_auth.py)
    metrics_key: str | None = None
    metrics_per_tenant: bool = True
    # a request whose replica fails before answering is retried on another replica of its model
    retry_max_attempts: int = 3
    retry_budget_ratio: float = 0.2
    retry_budget_min_per_s: float = 5.0
    # x-tokenops-* response headers (model, replica, cache, route, cost); off where routing must stay private
    decision_headers: bool = True
    # bundled-engine models resident at once (0: all); the others load on demand, the least recently
    # used idle one closed to make room (tokenops/backends/model_swap.py)
    max_loaded_models: int = 0
    # admission (tokenops/gateway/core/admission.py): past a model's slots, requests wait in its queue,
    # bounded by requests and by (estimated) prompt tokens; past that a 429 with Retry-After
    max_queued_requests: int = 256
    max_queued_tokens: int = 262144
    upstream_max_running: int = 256  # slots of one upstream replica (a bundled engine's: max_num_seqs)
    # SIGTERM: requests in flight get this long to finish, then are cancelled and the server exits
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name, least in (("max_queued_requests", 0), ("max_queued_tokens", 0), ("upstream_max_running", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"[gateway] {name}: expected an integer >= {least}, got {value!r}")
        drain = self.drain_timeout_s
        if isinstance(drain, bool) or not isinstance(drain, (int, float)) or not 0 <= drain <= 3600:
            raise ConfigError(f"[gateway] drain_timeout_s: expected seconds in [0, 3600], got {drain!r}")
        if isinstance(self.max_loaded_models, bool) or not isinstance(self.max_loaded_models, int):
            raise ConfigError(f"[gateway] max_loaded_models: expected an integer, got {self.max_loaded_models!r}")
        if self.max_loaded_models < 0:
            raise ConfigError("[gateway] max_loaded_models must be >= 0 (0: no bound)")
        row, chain = self.max_stored_response_bytes, self.max_chain_bytes
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (row, chain)) or row > chain:
            raise ConfigError(
                "[gateway] max_stored_response_bytes and max_chain_bytes: expected integers >= 1, "
                f"the first <= the second; got {row!r} and {chain!r}"
            )


@dataclass(slots=True)
class TelemetrySettings:
    """``[telemetry]``: OpenTelemetry traces (tokenops/gateway/observability/tracing.py). Off unless a collector is named
    here or in the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``."""

    otlp_endpoint: str | None = None  # OTLP/HTTP collector, e.g. http://localhost:4318
    service_name: str = "tokenops"


def _engine_settings_class() -> type:
    """``[engine]``: the :class:`~tokenops.engine.core.config.EngineConfig` fields marked as
    settings (same names, types and defaults: declared there once) plus ``profile``."""
    from tokenops.engine.core.config import EngineConfig, setting_fields

    hints = typing.get_type_hints(EngineConfig)
    cls = dataclasses.make_dataclass(
        "EngineSettings",
        [(f.name, hints[f.name], field(default=f.default)) for f in setting_fields()]
        # A tuned profile to start with: profiles/engines/NAME.toml (`tokenops serve --engine-profile NAME`).
        + [("profile", str | None, field(default=None))],
        slots=True,
    )
    cls.__module__ = __name__
    cls.__doc__ = "The ``[engine]`` section: defaults of every local model's engine (tokenops/engine/core/config.py)."
    return cls


if typing.TYPE_CHECKING:

    class EngineSettings:
        """What the type checker sees of the class built above: ``profile`` typed, the
        EngineConfig setting fields as ``Any`` (they are generated, so not declared twice)."""

        profile: str | None

        def __init__(self, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...
else:
    EngineSettings = _engine_settings_class()


@dataclass(slots=True)
class StoreSettings:
    path: str = "store/tokenops.duckdb"
    flush_interval_s: float = 0.5
    batch_rows: int = 5000
    #: Stored /v1/responses answers (tokenops/store/stored_responses.py): dropped after this
    #: age, and beyond this many per tenant (its oldest first).
    responses_max_age_hours: float = 720.0
    responses_max_per_tenant: int = 10000


@dataclass(slots=True)
class Settings:
    models: list[ModelConfig] = field(default_factory=list)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    batches: BatchSettings = field(default_factory=BatchSettings)  # [batches]: the Batch API (docs/batches.md)
    shared: SharedSettings = field(default_factory=SharedSettings)  # [shared]: state replicas share (docs/scale-out.md)
    plugins: dict[str, Any] = field(default_factory=dict)  # [plugins] enable/disable + per-plugin tables
    slo: list[str] = field(default_factory=list)
    source: str | None = None  # the file these came from

    @property
    def slos(self) -> list[SLO]:
        return parse_slos(self.slo)

    def plugin_settings(self, name: str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        """``[plugins.NAME]`` as a dict. With ``defaults``: those values overlaid by the
        configured ones, and a ``ValueError`` naming any key not among the defaults."""
        value = self.plugins.get(name, {})
        conf = value if isinstance(value, dict) else {}
        if defaults is None:
            return conf
        unknown = sorted(set(conf) - set(defaults))
        if unknown:
            raise ValueError(
                f"[plugins.{name}] unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(defaults))}"
            )
        return {**defaults, **conf}


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    kwargs = {}
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        default = getattr(cls(), key) if cls is not ModelConfig else None
        # `int | None` fields (torch_threads, max_model_len): env values arrive as strings
        optional_scalar = _scalar_of_optional(hints.get(key)) if default is None else None
        if default is not None and not isinstance(default, (dict, list)) and value is not None:
            kwargs[key] = _coerce(value, type(default), f"{where}.{key}")
        elif optional_scalar is not None and value is not None:
            kwargs[key] = _coerce(value, optional_scalar, f"{where}.{key}")
        else:
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def _scalar_of_optional(hint: Any) -> type | None:
    """``int | None`` -> ``int`` (likewise float, bool, str); None for anything else."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float, bool, str) else None


def _coerce(value: Any, typ: type, where: str) -> Any:
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            if typ is bool:
                low = value.lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return typ(value)
        except ValueError:
            raise ConfigError(f"{where}: expected {typ.__name__}, got {value!r}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{where}: expected {typ.__name__}, got {value!r}")


def _env_overrides(data: dict[str, Any], environ: dict[str, str]) -> None:
    short = {"TOKENOPS_STORE": ("store", "path"), "TOKENOPS_ADMIN_KEY": ("gateway", "admin_key")}
    for var, (section, key) in short.items():
        if environ.get(var):
            data.setdefault(section, {})[key] = environ[var]
    for var, value in environ.items():
        if not var.startswith("TOKENOPS_") or "__" not in var:
            continue
        section, _, key = var[len("TOKENOPS_") :].lower().partition("__")
        if section not in ("gateway", "engine", "store", "lora", "shared"):
            raise ConfigError(f"{var}: unknown section {section!r}; use GATEWAY, ENGINE, STORE, LORA or SHARED")
        data.setdefault(section, {})[key] = value


def load_settings(path: str | os.PathLike | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Load settings from ``path`` (or ``TOKENOPS_CONFIG``, or ``./tokenops.toml``
    when present), apply environment overrides and validate."""
    environ = dict(os.environ if environ is None else environ)
    if path is None:
        path = environ.get("TOKENOPS_CONFIG") or ("tokenops.toml" if Path("tokenops.toml").is_file() else None)
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from None
    where = str(path) if path else "settings"
    _env_overrides(data, environ)
    allowed = {"models", "gateway", "engine", "store", "telemetry", "lora", "batches", "shared", "plugins", "slo"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    models_raw = data.get("models", [])
    if not isinstance(models_raw, list):
        raise ConfigError(f"{where}: use [[models]] tables for models")
    models = [_build(ModelConfig, dict(m), f"{where} [[models]] #{i + 1}") for i, m in enumerate(models_raw)]
    names = [m.name for m in models]
    if len(names) != len(set(names)):
        raise ConfigError(f"{where}: model names must be unique, got {names}")
    slo = data.get("slo", {})
    slo_list = slo.get("targets", []) if isinstance(slo, dict) else list(slo)
    settings = Settings(
        models=models,
        gateway=_build(GatewaySettings, data.get("gateway", {}), f"{where} [gateway]"),
        engine=_build(EngineSettings, data.get("engine", {}), f"{where} [engine]"),
        store=_build(StoreSettings, data.get("store", {}), f"{where} [store]"),
        telemetry=_build(TelemetrySettings, data.get("telemetry", {}), f"{where} [telemetry]"),
        lora=_build(LoraSettings, data.get("lora", {}), f"{where} [lora]"),
        batches=_build(BatchSettings, data.get("batches", {}), f"{where} [batches]"),
        shared=_build(SharedSettings, data.get("shared", {}), f"{where} [shared]"),
        plugins=data.get("plugins", {}),
        slo=list(slo_list),
        source=str(path) if path else None,
    )
    try:
        _ = settings.slos  # parsed (and checked) on first access
    except ValueError as e:
        raise ConfigError(f"{where} [slo]: {e}") from None
    replace = settings.plugins.get("replace", [])
    if not isinstance(replace, list) or not all(isinstance(n, str) for n in replace):
        raise ConfigError(f"{where} [plugins] replace: a list of built-in plugin names another plugin may take")
    replaceable_plugins.update(replace)
    return settings
