"""The synchronous engine: ``add_request`` / ``step`` / ``abort`` plus ``generate`` and stats.

Context policy: a prompt must leave room for at least one generated token
(``len(prompt) < max_model_len``) or :class:`PromptTooLongError` is raised. A
``max_tokens`` that would run past ``max_model_len`` is *capped*, not rejected: the
completion ends with ``finish_reason="length"`` at the context limit (vLLM rejects
such requests instead; capping suits chat clients that send a large max_tokens).

Failures are per request: if the batched forward raises, the chunks are retried one
by one and only the requests whose chunk still fails are finished with ``error`` set.

Policies (queue orders, speculative proposers, KV policy, weight transforms, compile) come
in as the ``policies`` argument (:class:`tokenops.engine.core.policies.EnginePolicies`, the
built-ins by default); the engine never consults the plugin manager. ``tokenops serve``
builds them from the hooks with :func:`tokenops.policy_hooks.build_engine`.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine_stats import apply_engine_tunables, engine_stats
from tokenops.engine.core.execute import execute_chunks
from tokenops.engine.core.output_processor import OutputProcessor, RequestState
from tokenops.engine.core.outputs import RequestOutput
from tokenops.engine.core.policies import EnginePolicies, builtin_kv_policy
from tokenops.engine.core.scheduler import Scheduler, SchedulerOutput
from tokenops.engine.core.sequence import INTERACTIVE, PRIORITY_CLASSES, Sequence, SequenceStatus
from tokenops.engine.sampling.prompt_logprobs import record_prompt_logprobs
from tokenops.engine.sampling.sampling import SampledToken, Sampler, SamplingParams


class PromptTooLongError(ValueError):
    """The prompt does not fit the model's context."""


class EngineRequestError(RuntimeError):
    """The engine failed one request (the message says why); other requests go on."""


class LLMEngine:
    """Continuous-batching engine over a :class:`ModelRunner`.

    ``runner`` None builds a :class:`~tokenops.engine.core.model_runner.ModelRunner` for
    ``config`` (with ``policies.transforms`` and ``policies.compile``); ``policies`` None
    means the built-ins (:class:`~tokenops.engine.core.policies.EnginePolicies`). Unknown
    ``schedule_policy`` or ``speculative`` names raise ValueError naming the available ones.
    """

    def __init__(self, config: EngineConfig, runner: Any = None, *, policies: EnginePolicies | None = None) -> None:
        policies = EnginePolicies() if policies is None else policies
        policies.schedule_order(config.schedule_policy)  # names checked before the weights load
        proposer_factory = policies.proposer_factory(config.speculative) if config.speculative else None
        if runner is None:
            from tokenops.engine.core.model_runner import ModelRunner

            runner = ModelRunner(config, policies.transforms, policies.compile)
        self.policies = policies
        self.config = config
        self.runner = runner
        self.tokenizer = runner.tokenizer
        #: Rows of the model's logits (``logit_bias`` token ids must be below it).
        self.vocab_size: int | None = getattr(runner, "vocab_size", None)
        self.model_name = config.model_name or runner.model_name
        kv_tokens = runner.num_blocks * runner.block_size
        self.max_model_len = min(x for x in (config.max_model_len, runner.max_model_len, kv_tokens) if x)
        self.scheduler = Scheduler(config, runner.num_blocks, policies.schedule_orders)
        self.sampler = Sampler(config.seed, getattr(self.tokenizer, "eos_token_ids", ()) or ())
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len)
        self._requests: dict[str, RequestState] = {}
        self._pending: list[RequestOutput] = []  # aborts, reported by the next step
        self._ids = itertools.count()
        self.num_steps = 0
        self.last_step_time_s = 0.0
        self.last_batch_tokens = 0
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0
        #: Speculative decoding (``config.speculative`` names the proposer), see spec_decode.py.
        self.spec_decoder: Any = None
        if proposer_factory is not None:
            from tokenops.engine.spec.spec_decode import SpecDecoder

            self.spec_decoder = SpecDecoder(self, proposer_factory(config))
            self.scheduler.num_spec_tokens_fn = self.spec_decoder.num_tokens_for
        #: KV policy (``policies.kv_policy``, else sink + window when configured) or None.
        self.kv_policy = policies.kv_policy if policies.kv_policy is not None else builtin_kv_policy(config)
        store = getattr(runner, "kv_offload", None)
        if store is not None:  # KV offload tier: the block manager keeps its books
            from tokenops.engine.kv.offload_index import OffloadIndex

            self.scheduler.block_manager.offload = OffloadIndex(store.num_host_slots, store.num_disk_blocks)
        self._grammar_compiler: Any = None

    @property
    def grammar_compiler(self) -> Any:
        """The :class:`tokenops.engine.sampling.grammar.GrammarCompiler` for this model's tokenizer
        (built on first use): ``SamplingParams.grammar`` matchers come from it."""
        if self._grammar_compiler is None:
            from tokenops.engine.sampling.grammar import GrammarCompiler

            vocab = getattr(self.runner, "vocab_size", None) or self.tokenizer.vocab_size
            self._grammar_compiler = GrammarCompiler.for_tokenizer(self.tokenizer, vocab)
        return self._grammar_compiler

    # -- requests ----------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        tenant: str = "default",
        priority: int = 0,
        lora: str | None = None,
        priority_class: str = INTERACTIVE,
    ) -> None:
        """Queue a request; raises ValueError (or PromptTooLongError) when it cannot run.

        ``lora`` names a loaded LoRA adapter the request runs with (None: the base model);
        ``priority_class`` is "interactive" or "batch" (see tokenops/engine/core/scheduler.py)."""
        if priority_class not in PRIORITY_CLASSES:
            raise ValueError(f"priority_class must be one of {', '.join(PRIORITY_CLASSES)}, not {priority_class!r}")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
            vocab = getattr(self.runner, "vocab_size", None)
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or (vocab and t >= vocab) for t in token_ids):
                raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if params.logit_bias and self.vocab_size and max(params.logit_bias) >= self.vocab_size:
            raise ValueError(
                f"logit_bias token id {max(params.logit_bias)} is outside the vocabulary [0, {self.vocab_size})"
            )
        if len(token_ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(token_ids)} tokens but the model's context is {self.max_model_len} tokens "
                f"(at least one must be left to generate); shorten the prompt"
            )
        if lora is not None and lora not in self.lora_names():
            raise ValueError(f"LoRA adapter {lora!r} is not loaded")
        seq = Sequence(request_id, token_ids, params, tenant=tenant, priority=priority, priority_class=priority_class)
        seq.lora = lora
        if params.seed is not None:
            seq.generator = Sampler.new_generator(params.seed, 0)
        state = RequestState(request_id, token_ids, params, seq.arrival_time, [seq])
        self._requests[request_id] = state
        self.scheduler.add(seq)
        self.total_prompt_tokens += len(token_ids)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; the next ``step`` reports it finished."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        for seq in self.scheduler.abort(request_id):
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
        for seq in state.seqs:
            seq.num_pending_forks = 0
        self._pending.append(self.output_processor.make_output(state))

    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._pending)

    # -- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns outputs of the requests that advanced or finished."""
        outputs, self._pending = self._pending, []
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        transfers = self.scheduler.block_manager.take_transfers()
        if transfers:  # offload-tier saves and loads, before anything writes those blocks
            self.runner.transfer_kv(transfers)
        if batch.is_empty:
            return outputs
        for src, dst in batch.block_copies:
            self.runner.copy_block(src, dst)
        if self.spec_decoder is not None:
            self.spec_decoder.propose(batch.chunks)
        num_batched_tokens = batch.num_batched_tokens
        logits, failed = self._execute(batch)
        touched: dict[str, RequestState] = {}
        for seq, error in failed:
            self._fail(seq.request_id, error, outputs)
        batch.chunks = [c for c in batch.chunks if c.seq.status is SequenceStatus.RUNNING]
        spec_chunks = [c for c in batch.chunks if c.num_spec_tokens]
        if spec_chunks:  # verified (and their computed counts rolled back) below
            batch.chunks = [c for c in batch.chunks if not c.num_spec_tokens]
        self.scheduler.update_computed(batch)
        if any(c.num_logits > 1 for c in batch.chunks):
            record_prompt_logprobs(logits, batch.chunks, self.output_processor.logprob_entry)
        rows, seqs = [], []
        for chunk in batch.chunks:
            if not chunk.is_last:
                continue
            seq = chunk.seq
            family = [seq]
            if seq.num_pending_forks:
                family += self.scheduler.fork(seq)
                self._requests[seq.request_id].seqs += family[1:]
            for member in family:
                if member is not seq and seq.params.seed is not None:
                    member.generator = Sampler.new_generator(seq.params.seed, member.output_index)
                if member.params.max_tokens == 0:  # scoring only: the prompt's logprobs are all it asked for
                    self._finish_unsampled(member, touched)
                    continue
                rows.append(chunk.row + chunk.num_logits - 1)
                seqs.append(member)
        if seqs:
            self._sample_and_append(logits, rows, seqs, touched)
        if spec_chunks:
            self.spec_decoder.verify(logits, spec_chunks, touched)
        if self.kv_policy is not None:
            self._apply_kv_policy()
        self.num_steps += 1
        self.last_batch_tokens = num_batched_tokens
        self.last_step_time_s = time.perf_counter() - start
        self.scheduler.step_cost.observe_chunks(batch.chunks, self.last_step_time_s)  # batch_step_overhead
        for state in touched.values():
            outputs.append(self.output_processor.make_output(state))
            if state.is_finished:
                self._requests.pop(state.request_id, None)
        return outputs

    def _apply_kv_policy(self) -> None:
        """Release the blocks the KV policy drops from decoding sequences."""
        bm, policy = self.scheduler.block_manager, self.kv_policy
        assert policy is not None  # step() calls this only when a KV policy is set
        for seq in self.scheduler.running:
            if seq.is_prefill or seq.num_pending_forks:
                continue
            for index in policy.blocks_to_evict(len(seq.token_ids), bm.block_size, seq.block_table):
                bm.evict(seq, index)

    def _execute(self, batch: SchedulerOutput) -> tuple[Any, list[tuple[Sequence, str]]]:
        """Run the forward; returns logits (row ``chunk.row`` per chunk) and failed sequences."""
        return execute_chunks(self.runner, batch.chunks)

    def _sample_and_append(
        self, logits: Any, rows: list[int], seqs: list[Sequence], touched: dict[str, RequestState]
    ) -> None:
        import torch

        if rows != list(range(logits.shape[0])):  # the common case (every row sampled once) copies nothing
            logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
        try:
            sampled = self.sampler.sample(logits, seqs)
        except Exception as e:  # e.g. NaN logits: fail these requests, keep the engine up
            for seq in seqs:
                self._fail(seq.request_id, f"sampling failed: {type(e).__name__}: {e}", None)
            return
        now = time.time()
        for seq, token in zip(seqs, sampled):
            state = self._requests.get(seq.request_id)
            if state is None or seq.is_finished:
                continue
            try:
                self.output_processor.append_token(seq, token)
            except Exception as e:
                self._fail(seq.request_id, f"{type(e).__name__}: {e}", None)
                continue
            self.total_generation_tokens += 1
            if state.first_token_time is None:
                state.first_token_time = now
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
            touched[seq.request_id] = state

    def _finish_unsampled(self, seq: Sequence, touched: dict[str, RequestState]) -> None:
        """End a ``max_tokens == 0`` sequence once its prompt is computed (nothing is sampled)."""
        state = self._requests.get(seq.request_id)
        if state is None or seq.is_finished:
            return
        seq.finish_reason = "length"
        if state.first_token_time is None:
            state.first_token_time = time.time()
        self.scheduler.finish(seq)
        touched[seq.request_id] = state

    def append_tokens(self, seq: Sequence, sampled: list[SampledToken], touched: dict[str, RequestState]) -> int:
        """Append ``sampled`` to ``seq`` (speculative decoding: the accepted proposals and the
        target's token) until one finishes it; returns how many were appended. A token the
        output processor rejects fails the request. ``touched`` collects the request's state
        for this step's outputs."""
        state = self._requests.get(seq.request_id)
        if state is None or seq.is_finished:
            return 0
        num = 0
        for token in sampled:
            try:
                self.output_processor.append_token(seq, token)
            except Exception as e:
                self._fail(seq.request_id, f"{type(e).__name__}: {e}", None)
                return num
            num += 1
            self.total_generation_tokens += 1
            if state.first_token_time is None:
                state.first_token_time = time.time()
            touched[seq.request_id] = state
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                break
        return num

    def _fail(self, request_id: str, error: str, outputs: list[RequestOutput] | None) -> None:
        state = self._requests.get(request_id)
        if state is None:
            return
        state.error = error
        self.abort(request_id)
        if outputs is not None:
            outputs.extend(self._pending)
            self._pending = []

    # -- scripts -----------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        loras: list[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion (``loras``: each prompt's adapter, None the base);
        returns their final outputs in order."""
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} sampling params")
        ids = [f"generate-{next(self._ids)}" for _ in prompts]
        for request_id, prompt, p, lora in zip(ids, prompts, plist, loras or [None] * len(prompts)):
            self.add_request(request_id, prompt, p, lora=lora)
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while wanted - final.keys():
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
        errors = [f"{i}: {final[i].error}" for i in ids if final[i].error]
        if errors:
            raise EngineRequestError("; ".join(errors))
        return [final[i] for i in ids]

    # -- LoRA adapters (tokenops/engine/lora/lora_adapters.py) ------------------------------------------

    def lora_names(self) -> list[str]:
        lora = getattr(self.runner, "lora", None)
        return list(lora.adapters) if lora is not None else []

    def load_lora(self, name: str, path: str, check_base: bool = True) -> dict[str, Any]:
        """Load a PEFT adapter folder as ``name``; raises AdapterError (a ValueError), changing nothing."""
        return self.runner.load_lora(name, path, check_base).info()

    def unload_lora(self, name: str) -> dict[str, Any]:
        """Unload an adapter no request is using (ValueError otherwise)."""
        busy = [r for r, st in self._requests.items() if any(s.lora == name for s in st.seqs)]
        if busy:
            raise ValueError(f"LoRA adapter {name!r} is in use by {len(busy)} request(s)")
        return self.runner.unload_lora(name).info()

    # -- introspection and tuning ------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return engine_stats(self)

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        """Apply live engine tunables (names with or without ``engine.``); returns them
        as ``{"engine.<name>": value}``. Nothing is applied if any name or value is bad."""
        return apply_engine_tunables(self, values)
