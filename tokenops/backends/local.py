"""The ``local`` backend: the bundled engine in-process.

The engine loop runs on one background thread (:class:`AsyncLLMEngine`); this
adapter turns a request's typed fields into :class:`SamplingParams`, checks the
context window, salts the prefix cache with the tenant, and runs the request;
:mod:`tokenops.backends.local_stream` turns the engine's outputs (and their logprobs)
into deltas in OpenAI's shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from tokenops.backends.base import Delta, collect, replica_name
from tokenops.backends.field_table import check_bundled_fields
from tokenops.backends.local_fields import check_content_parts, echo_logprobs, processor_params
from tokenops.backends.local_stream import ChoiceStreams, engine_failure
from tokenops.backends.local_structured import plan_request
from tokenops.backends.model_swap import ModelSwap, engine_held
from tokenops.backends.plugin_calls import PluginCalls, builtin_calls
from tokenops.backends.prompt_bound import check_prompt_fits, max_token_chars
from tokenops.backends.reasoning_control import decide_budget, thinking_control
from tokenops.backends.reasoning_parsers import get_reasoning_parser
from tokenops.backends.tool_confidence import min_confidence, text_only_grammar
from tokenops.backends.tool_format import AUTO, GENERIC, tool_format_of
from tokenops.backends.tool_parsers import get_tool_call_parser
from tokenops.config import ModelConfig, Settings
from tokenops.engine.sampling.sampling_defaults import SamplingDefaults, model_sampling_defaults
from tokenops.types import BackendError, GatewayRequest, GatewayResponse


def engine_config_for(model: ModelConfig, settings: Settings, configure_engine: Callable[[Any], Any]) -> Any:
    """The :class:`EngineConfig` of one model: ``[engine]`` settings, then the model's overrides,
    then ``configure_engine`` (the plugins' ``tokenops_engine_config`` when the backend was built
    with :func:`tokenops.policy_hooks.plugin_calls`)."""
    from tokenops.engine.core.config import EngineConfig

    overrides = dict(model.engine)
    overrides.setdefault("model", model.path)
    overrides.setdefault("model_name", model.name)
    try:
        config = EngineConfig.from_settings(settings.engine, **overrides)
        # plugins (kv_policy, speculative...) may set fields: check the combination they produce
        # (and the schedule policy / proposer names) now, at start, not on the first long generation
        return configure_engine(config)
    except (TypeError, ValueError) as e:
        from tokenops.config import ConfigError

        raise ConfigError(f"model {model.name!r}: {e}") from None


class LocalBackend:
    """One in-process engine serving one model."""

    kind = "local"

    def __init__(
        self, model: ModelConfig, settings: Settings, engine: Any = None, *, calls: PluginCalls | None = None
    ) -> None:
        self.model = model.name
        self.name = replica_name(model)
        #: what this backend asks the plugins (tokenops/backends/plugin_calls.py); built-ins when none is given
        self.calls = calls if calls is not None else builtin_calls()
        self.config = engine_config_for(model, settings, self.calls.configure_engine) if engine is None else None
        self.engine = engine
        #: set once start() ends, loaded or not: the LoRA adapters on this engine wait for it
        self.started = asyncio.Event()
        #: the bound on resident engines this one is under ([gateway] max_loaded_models), or None:
        #: its engine is then built on a request's demand and may be closed to make room
        self.swap: ModelSwap | None = None
        #: why the engine failed to load (set by the gateway at start, or by the swap on demand), else None
        self.load_error: str | None = None
        self.max_model_len: int | None = getattr(engine, "max_model_len", None)
        #: the parser in use: the configured one, or (``auto``) the one the template's calls are in, found at load
        self.tool_call_parser = model.tool_call_parser if model.tool_call_parser != AUTO else "hermes"
        self.model_tool_call_parser = model.tool_call_parser
        #: the confidence gate for free calls (tokenops/backends/tool_confidence.py; 0: off)
        self.tool_call_min_confidence = model.tool_call_min_confidence
        #: native | generic, decided when the engine loads (None before)
        self.tool_format: str | None = None
        #: what unset temperature / top_p / top_k become (the model's recommendation, else llama.cpp's)
        self.sampling_defaults = SamplingDefaults()
        try:
            get_tool_call_parser(self.tool_call_parser)
            self.reasoning_parser = get_reasoning_parser(model.reasoning_parser)
        except ValueError as e:
            from tokenops.config import ConfigError

            raise ConfigError(f"model {model.name!r}: {e}") from None

    @property
    def ready(self) -> bool:
        """Loaded, or (under a bound) started and loadable on demand; a model that failed at start stays failed."""
        if self.engine is not None:
            return True
        return self.swap is not None and self.started.is_set() and self.load_error is None

    @property
    def num_slots(self) -> int | None:
        """Requests this engine runs at once (``max_num_seqs``, live): the gateway queues the rest
        (tokenops/gateway/core/admission.py); None when unknown."""
        config = getattr(self.engine, "config", None) if self.engine is not None else self.config
        slots = getattr(config, "max_num_seqs", None)
        return slots if isinstance(slots, int) else None

    async def start(self) -> None:
        try:
            if self.config is not None:  # read at start, loaded now or on demand (model swap): the card shows them
                self.sampling_defaults = await asyncio.to_thread(model_sampling_defaults, self.config.model)
            await (self.load_engine() if self.swap is None else self.swap.start(self))
        finally:
            self.started.set()

    async def load_engine(self) -> None:
        """Build the engine (on its own thread: the event loop and /health stay free)."""
        if self.engine is None:
            from tokenops.engine.core.async_engine import AsyncLLMEngine

            # Loading weights blocks for a while: keep the event loop (and /health) free. The
            # plugins' engine policies are collected once, here (the config is configured already).
            build = self.calls.build_engine
            config = self.config
            assert config is not None  # __init__ builds it whenever no engine is passed in
            # Built on its own engine thread (one OpenMP pool: see build_on_engine_thread).
            self.engine = await asyncio.to_thread(AsyncLLMEngine.build_on_engine_thread, lambda: build(config))
        start = getattr(self.engine, "start", None)
        if start is not None:
            start()
        self.max_model_len = self.engine.max_model_len
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is not None:
            # before the first await: the engine counts as loaded (/ready, the model card) from here on
            self._choose_tool_format(tokenizer)
            # measured once, off the loop: check_prompt_fits needs it per request
            await asyncio.to_thread(max_token_chars, tokenizer)

    def _choose_tool_format(self, tokenizer: Any) -> None:
        """Native calls when the chat template renders tools, else the generic format
        (tokenops/backends/tool_format.py); logged once per load."""
        self.tool_format, self.tool_call_parser = tool_format_of(tokenizer, self.model_tool_call_parser)
        if self.tool_format == GENERIC:  # shown at the default log level: why calls look as they do
            logging.getLogger("tokenops.backends").warning(
                "model %s: tool format: generic (its chat template renders no tools, or calls in no format a "
                "tool_call_parser reads: they go in a system "
                "message and calls are grammar-constrained; docs/serve.md, Tools on every model)",
                self.model,
            )
        else:
            logging.getLogger("tokenops.backends").info(
                "model %s: tool format: native (%s)", self.model, self.tool_call_parser
            )

    async def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            await asyncio.to_thread(self.engine.shutdown)

    async def unload_engine(self) -> None:
        """:meth:`close`, then drop the engine (weights and KV cache go with the last reference);
        :meth:`load_engine` builds it again from the same config."""
        await self.close()
        self.engine = None

    def stats(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        stats = dict(self.engine.stats())
        stats.setdefault("model", self.model)
        return stats

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.engine is None:
            return {}
        return self.engine.apply_tunables(values)

    # -- requests ---------------------------------------------------------

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    def prompt_token_ids(self, request: GatewayRequest) -> list[int]:
        """The prompt's token ids as :meth:`stream` builds them (chat template, tools as planned):
        ``/v1/messages/count_tokens`` counts with it, so its count is the engine's."""
        plan = self._plan(request) if request.kind == "chat" else None
        return self._prompt_ids(request, plan)

    def _prompt_ids(self, request: GatewayRequest, plan: Any = None) -> list[int]:
        tok = self.engine.tokenizer
        if request.kind == "chat":
            messages = [_plain(m) for m in request.messages or []]
            if plan is not None:
                messages = plan.prompt_messages(messages)
            try:
                text = tok.apply_chat_template(
                    messages, add_generation_prompt=True, **(plan.template_kwargs if plan else {})
                )
            except ValueError as e:  # the template refused the conversation (raise_exception)
                why = " (tools use the generic format, in a system message)" if plan and plan.generic_tools else ""
                raise BackendError(f"{e}{why}", kind="bad_request", status=400, backend=self.name) from None
            return tok.encode(text, add_special_tokens=False)
        if isinstance(request.prompt, list):
            return list(request.prompt)
        return tok.encode(request.prompt or "", add_special_tokens=True)

    def _sampling(self, request: GatewayRequest, num_prompt: int) -> Any:
        from tokenops.engine.sampling.sampling import SamplingParams

        sampling, output = request.sampling, request.output
        max_tokens = request.max_tokens
        limit = self.max_model_len
        if limit is not None:
            if num_prompt >= limit or (sampling.is_max_tokens_sent and num_prompt + max_tokens > limit):
                raise BackendError(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} in the completion). "
                    "Please reduce the length of the prompt or completion.",
                    kind="context_length",
                    status=400,
                    backend=self.name,
                )
            max_tokens = min(max_tokens, limit - num_prompt)
        if request.kind == "chat":
            logprobs = (output.top_logprobs or 0) if output.logprobs else None
        else:
            logprobs = None if output.logprobs is None else int(output.logprobs)
        extras = processor_params(request, max_tokens, getattr(self.engine, "vocab_size", None), self.name)
        try:
            return SamplingParams(
                n=sampling.n or 1,
                max_tokens=max_tokens,
                # temperature, top_p, top_k, min_p, seed: a value the request sent wins over the model's default
                **sampling.engine_args(self.sampling_defaults),
                stop=list(sampling.stop),
                ignore_eos=sampling.ignore_eos,
                logprobs=logprobs,
                prompt_logprobs=echo_logprobs(request),
                is_prefill_only=max_tokens == 0,  # Anthropic's cache pre-warming (messages_api.py)
                **extras,
            )
        except ValueError as e:
            raise BackendError(str(e), kind="bad_request", status=400, backend=self.name) from None

    async def _prepare(self, request: GatewayRequest) -> tuple[Any, list[int], Any]:
        """(structured-output plan, prompt ids, sampling params) of a request, with its 400s first."""
        if self.engine is None:
            raise BackendError(f"{self.name} is still loading", kind="unavailable", status=503, backend=self.name)
        check_bundled_fields(request, self.name)  # a 400 for fields the engine cannot act on (backends/field_table.py)
        if request.kind == "chat":
            check_content_parts(request, self.name)  # a text-only model: an image is a 400, never dropped
        # a prompt that cannot fit is refused before tokenizing; the rest is tokenized (and the
        # chat template rendered) in a worker thread so a huge prompt does not stall the event loop
        check_prompt_fits(request, getattr(self.engine, "tokenizer", None), self.max_model_len, self.name)
        # the plan measures and samples the schemas (json_shortest): off the loop, like tokenizing
        plan = await asyncio.to_thread(self._plan, request) if request.kind == "chat" else None
        prompt_ids = await asyncio.to_thread(self._prompt_ids, request, plan)
        params = self._sampling(request, len(prompt_ids))
        if plan is not None and plan.grammar is not None:
            params.grammar = await self._compile(plan.grammar)
        if (
            self.reasoning_parser is not None
            or request.output.reasoning_effort is not None
            or request.output.max_thinking_tokens is not None
        ):
            params.thinking = await asyncio.to_thread(self._thinking, request, prompt_ids)
        return plan, prompt_ids, params

    async def stream(self, request: GatewayRequest, lora: str | None = None) -> AsyncIterator[Delta]:
        """The request's deltas; ``lora`` names the loaded adapter it runs with (tokenops/backends/lora.py).
        Under a bound on resident engines, it first waits for this model's engine (loaded on demand)."""
        async with engine_held(self):
            async for delta in self._stream(request, lora):
                yield delta

    async def _stream(self, request: GatewayRequest, lora: str | None) -> AsyncIterator[Delta]:
        plan, prompt_ids, params = await self._prepare(request)
        streams = ChoiceStreams(request, prompt_ids, params, plan, self.reasoning_parser, self.engine.tokenizer)
        threshold = min_confidence(self.tool_call_min_confidence, self.tool_call_parser)
        if plan is not None and plan.is_free and threshold > 0 and params.n == 1:
            streams.gate_threshold = threshold
            streams.show_logprobs = params.logprobs is not None
            params.logprobs = 0 if params.logprobs is None else params.logprobs  # the chosen tokens' only
        last = None
        async for out in self._generate(request, prompt_ids, params, lora):
            last = out
            for delta in streams.deltas(out):
                yield delta
        if last is None:
            raise BackendError(f"{self.name}: the engine produced no output", "error", 500, self.name)
        streams.gate_decision(retried=bool(streams.gated))
        if streams.gated:  # the gate refused the only call: answer again, in text (tool_confidence.py)
            first, last = sum(streams.seen.values()), None
            tok = self.engine.tokenizer
            again_ids = prompt_ids + tok.encode(streams.sent_text.get(0, ""), add_special_tokens=False)
            params = self._sampling(request, len(again_ids))
            params.logprobs = params.logprobs if streams.show_logprobs else None
            params.grammar = await self._compile(text_only_grammar(self.tool_call_parser, plan.parser))
            plan = dataclasses.replace(plan, grammar=None, is_free=False)
            streams = ChoiceStreams(request, prompt_ids, params, plan, self.reasoning_parser, tok)
            async for out in self._generate(request, again_ids, params, lora):
                last = out
                for delta in streams.deltas(out):
                    yield delta
            streams.seen[-1] = first  # usage counts both answers' tokens
        usage = streams.usage(last)
        usage.prompt_tokens = len(prompt_ids)
        yield usage

    async def _generate(
        self, request: GatewayRequest, prompt_ids: list[int], params: Any, lora: str | None
    ) -> AsyncIterator[Any]:
        """The engine's outputs for one prompt, its failures as :class:`BackendError` s."""
        gen = self.engine.generate(
            prompt_ids,
            params,
            request_id=request.id,
            tenant=request.tenant,
            priority=request.priority,
            priority_class=request.priority_class,
            **({"lora": lora} if lora is not None else {}),
        )
        try:
            async with contextlib.aclosing(gen):
                async for out in gen:
                    yield out
        except BackendError:
            raise
        except ValueError as e:  # PromptTooLongError and sampling errors from the engine
            kind = "context_length" if type(e).__name__ == "PromptTooLongError" else "bad_request"
            raise BackendError(str(e), kind=kind, status=400, backend=self.name) from None
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as e:
            raise engine_failure(self.name, e) from None

    def _thinking(self, request: GatewayRequest, prompt_ids: list[int]) -> Any:
        """The engine's thinking control for this request (budget from the policy hook), or None."""
        budget = decide_budget(
            request, self.model, self.reasoning_parser is not None, self.name, self.calls.reasoning_budget
        )
        if self.reasoning_parser is None or request.kind != "chat":
            return None
        tok = self.engine.tokenizer
        p = self.reasoning_parser
        tail = tok.decode(prompt_ids[-8:], skip_special_tokens=False).rstrip()
        starts = tail.endswith(p.open_tag)  # templates that open the block in the prompt (DeepSeek-R1)
        if budget is not None:
            request.decide(
                "reasoning_budget",
                {
                    "max_thinking_tokens": budget.max_thinking_tokens,
                    "suppress": list(budget.suppress),
                    "reason": budget.reason,
                },
            )
        return thinking_control(tok, p.open_tag, p.close_tag, budget, starts)

    def _plan(self, request: GatewayRequest) -> Any:
        from tokenops.engine.sampling.grammar import GrammarError

        try:
            return plan_request(request.output, self.tool_call_parser, request.messages)
        except GrammarError as e:
            raise BackendError(str(e), kind="bad_request", status=400, backend=self.name) from None

    async def _compile(self, spec: Any) -> Any:
        """A matcher for ``spec``, compiled off the event loop and the engine thread."""
        from tokenops.engine.sampling.grammar import COMPILE_TIMEOUT_S, GrammarError

        compiler = self.engine.grammar_compiler
        await compiler.warm_async()  # once per tokenizer (seconds for a large vocabulary): not the schema's time
        try:
            return await asyncio.wait_for(compiler.compile_async(spec), COMPILE_TIMEOUT_S)
        except GrammarError as e:
            raise BackendError(str(e), kind="bad_request", status=400, backend=self.name) from None
        except TimeoutError:  # llguidance's fuel limits bound it; this bounds what they let through
            raise BackendError(
                f"the request's schema took more than {COMPILE_TIMEOUT_S:g} s to compile; simplify "
                "response_format or the tool parameters",
                kind="bad_request",
                status=400,
                backend=self.name,
            ) from None


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """Content given as parts (``[{"type": "text", "text": ...}]``) becomes one string."""
    content = message.get("content")
    if isinstance(content, list):  # text and refusal parts only (check_content_parts refused the others)
        content = "".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict))
    return {**message, "content": content or ""}
