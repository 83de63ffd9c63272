"""Sampling parameters and the sampler that turns a step's logits into tokens.

Every transform is row-wise, and seeded requests draw from their own
``torch.Generator``, so a seeded request yields the same tokens whatever else is in
the batch. Logprobs are ``log_softmax`` of the raw logits (before penalties, bias, temperature,
top-k and top-p), as the OpenAI API and vLLM report them. Rows of sequences that
decode under a grammar are masked first (only the tokens the grammar allows stay),
and only those rows: their logprobs are those of the masked distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tokenops.engine.sampling.logits_processors import apply_processors

if TYPE_CHECKING:
    import torch

#: Most top alternatives a request may ask for (OpenAI's limit).
MAX_LOGPROBS = 20


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first one on ties, as ``torch.argmax``). On CPU float32 through numpy:
    torch's CPU argmax took ~0.1 ms per 49k-token row, numpy's ~8 us (a batch-1 decode step of the
    quantized default model is ~10 ms, and a verify step argmaxes every row)."""
    import torch

    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def draw(probs: torch.Tensor, u: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[rows, vocab]`` (unnormalised weights >= 0 are fine) by inverting its
    cumulative distribution at ``u`` ``[rows]``, uniforms in [0, 1): the first token whose cumulative weight
    exceeds ``u * total``. Exact like ``torch.multinomial(probs, 1)`` and, on CPU, several times faster
    (``tests/benchmarks/sampling_speed.py``). The sum runs in float64 so a vocabulary of small probabilities
    loses no mass; a zero-weight token is never drawn. ``out``, a float64 tensor of ``probs``' shape, holds
    the cumulative sums (a caller that draws every step reuses one and saves the allocation)."""
    import torch

    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64, out=out)
    target = u.to(device=cdf.device, dtype=torch.float64).view(-1, 1) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1).view(-1)


#: Largest cumulative-sum buffer (bytes) the sampler keeps between steps; larger draws allocate their own.
_MAX_KEPT_CDF_BYTES = 64 << 20


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` is greedy."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # drop tokens under min_p x the likeliest token's probability (llama.cpp's, vLLM's); 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = none; k = the chosen token plus k alternatives
    #: A :class:`tokenops.engine.sampling.grammar.GrammarMatcher` at its start state: each sequence of the
    #: request decodes under its own copy (structured outputs, forced tool calls). None: free.
    grammar: Any = None
    #: A :class:`tokenops.engine.sampling.thinking.ThinkingControl` (count the thinking block, force it closed
    #: at a budget, mask reflection tokens while thinking). None: no thinking control.
    thinking: Any = None
    #: Penalties, bias and ``min_tokens``: see :mod:`tokenops.engine.sampling.logits_processors`.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    #: Logprobs of the prompt's tokens (the first has none) with k alternatives, as vLLM's
    #: ``prompt_logprobs``; the prompt then skips the prefix cache (its logits are needed).
    #: With it, ``max_tokens`` may be 0: the prompt is scored and nothing is generated.
    prompt_logprobs: int | None = None
    #: ``max_tokens`` may be 0 without ``prompt_logprobs`` too: the prompt is computed (into the
    #: prefix cache) and nothing is sampled (Anthropic's cache pre-warming, ``max_tokens: 0``).
    is_prefill_only: bool = False

    def __post_init__(self) -> None:
        _int("n", self.n, 1)
        if self.prompt_logprobs is not None:
            _int("prompt_logprobs", self.prompt_logprobs, 0)
            if self.prompt_logprobs > MAX_LOGPROBS:
                raise ValueError(f"prompt_logprobs must be at most {MAX_LOGPROBS}, got {self.prompt_logprobs}")
        _int("max_tokens", self.max_tokens, 0 if self.prompt_logprobs is not None or self.is_prefill_only else 1)
        self._check_processors()
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p!r}")
        if self.top_k == -1:
            self.top_k = 0  # vLLM's spelling of "off"
        _int("top_k", self.top_k, 0)
        if self.seed is not None:
            _int("seed", self.seed, None)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        for t in self.stop_token_ids:
            _int("stop_token_ids item", t, 0)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be at most {MAX_LOGPROBS}, got {self.logprobs}")

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
        rep = self.repetition_penalty
        if isinstance(rep, bool) or not isinstance(rep, (int, float)) or not 0 < rep < float("inf"):
            raise ValueError(f"repetition_penalty must be a number > 0, got {rep!r}")
        _int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logit_bias:
            bias = {}
            for token, value in self.logit_bias.items():
                _int("logit_bias key", token, 0)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                    raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for {token}")
                bias[token] = float(value)
            self.logit_bias = bias
        else:
            self.logit_bias = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _int(name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(slots=True)
class SampledToken:
    """One sampled token and, when asked for, its logprob and top alternatives."""

    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


class SamplingRow(Protocol):
    """What the sampler reads of one batch row: :class:`tokenops.engine.core.sequence.Sequence` provides it.

    Declared here, not imported, because ``sequence`` imports :class:`SamplingParams` from this module.
    """

    params: SamplingParams
    grammar: Any  # grammar matcher (fill_bitmask, reserve_tokens) or None
    thinking: Any  # thinking-budget state or None
    generator: Any  # torch.Generator when the request is seeded, else None
    token_ids: list[int]  # prompt then output (the penalties read them)
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int: ...


class Sampler:
    """Turns logits ``[num_seqs, vocab]`` into one token per sequence."""

    def __init__(self, seed: int = 0, eos_token_ids: Sequence[int] = ()) -> None:
        import torch

        self._torch = torch
        #: The tokens ``min_tokens`` keeps out (with each request's ``stop_token_ids``).
        self.eos_token_ids = tuple(eos_token_ids)
        #: Shared generator for unseeded sampling: engine runs are reproducible for a config seed.
        self.generator = torch.Generator().manual_seed(seed)
        self._cdf: torch.Tensor | None = None

    def _cdf_buffer(self, shape: torch.Size) -> torch.Tensor | None:
        """A float64 ``shape`` view of a buffer kept between steps (allocating ~MBs per step is most of a
        draw's cost on CPU), or None when it would be too large to keep."""
        n = shape[0] * shape[1]
        if n * 8 > _MAX_KEPT_CDF_BYTES:
            return None
        if self._cdf is None or self._cdf.numel() < n:
            self._cdf = self._torch.empty(n, dtype=self._torch.float64)
        return self._cdf[:n].view(shape[0], shape[1])

    @staticmethod
    def new_generator(seed: int, output_index: int) -> torch.Generator:
        import torch

        return torch.Generator().manual_seed(seed + output_index)

    def sample(self, logits: torch.Tensor, seqs: Sequence[SamplingRow]) -> list[SampledToken]:
        torch = self._torch
        assert logits.dim() == 2 and logits.shape[0] == len(seqs)
        logits = logits.float()
        grammar_rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if grammar_rows:
            logits = self._constrain(logits, grammar_rows, seqs)
        thinking_rows = [i for i, s in enumerate(seqs) if s.thinking is not None]
        if thinking_rows:
            from tokenops.engine.sampling.thinking import apply_thinking

            logits = apply_thinking(logits, thinking_rows, [seqs[i].thinking for i in thinking_rows])
        raw = logits  # what logprobs report (vLLM's raw_logprobs): masked, not penalised
        logits = apply_processors(logits, seqs, self.eos_token_ids)
        token_ids = argmax_rows(logits)  # greedy rows keep these
        random_rows = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            probs = self.probs(logits.index_select(0, rows), [seqs[i].params for i in random_rows]).cpu()
            # one uniform per row: unseeded rows from the shared generator (in row order), seeded rows from their own
            u = torch.empty(len(random_rows), dtype=torch.float64)
            shared = [j for j, i in enumerate(random_rows) if seqs[i].generator is None]
            if shared:
                u[shared] = torch.rand(len(shared), generator=self.generator, dtype=torch.float64)
            for j, i in enumerate(random_rows):
                if seqs[i].generator is not None:
                    u[j] = torch.rand(1, generator=seqs[i].generator, dtype=torch.float64)
            for j, token_id in enumerate(draw(probs, u, self._cdf_buffer(probs.shape)).tolist()):
                token_ids[random_rows[j]] = token_id
        out = [SampledToken(t) for t in token_ids]
        lp_rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if lp_rows:
            self._fill_logprobs(raw, lp_rows, seqs, out)
        return out

    def _constrain(self, logits: torch.Tensor, rows: list[int], seqs: Sequence[SamplingRow]) -> torch.Tensor:
        """``logits`` with the tokens each grammar row may not take next masked."""
        from tokenops.engine.sampling.grammar import apply_token_bitmasks, new_bitmask, steer_to_close

        bitmask = new_bitmask(len(rows), logits.shape[1])
        for j, i in enumerate(rows):
            seqs[i].grammar.fill_bitmask(bitmask, j)
        logits = apply_token_bitmasks(logits, rows, bitmask)
        closing = [
            i for i in rows if seqs[i].params.max_tokens - seqs[i].num_output_tokens <= seqs[i].grammar.reserve_tokens
        ]
        if closing:
            logits = steer_to_close(logits, closing, [seqs[i].grammar for i in closing])
        return logits

    def probs(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Per-row token probabilities after temperature, top-k, top-p and min-p ([rows, vocab]);
        speculative decoding verifies proposals against them."""
        torch = self._torch
        temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=logits.device)
        logits = logits / temps.unsqueeze(1)
        vocab = logits.shape[1]
        ks = [min(p.top_k, vocab) if p.top_k else vocab for p in params]
        if max(ks) < vocab:
            # every row keeps at most k tokens (the default sampler's top-k 40): top-p and min-p work on
            # the k best columns only, a partial selection instead of sorting the whole vocabulary
            values, order = logits.topk(max(ks), dim=-1)  # sorted, descending
            rank = torch.arange(values.shape[1], device=logits.device).unsqueeze(0)
            values = values.masked_fill(rank >= torch.tensor(ks, device=logits.device).unsqueeze(1), float("-inf"))
            kept = self._nucleus(values, params).softmax(dim=-1)
            return torch.zeros_like(logits).scatter_(1, order, kept)
        if any(ks_i < vocab for ks_i in ks):
            k = torch.tensor(ks, device=logits.device)
            sorted_desc = logits.sort(dim=-1, descending=True).values
            kth = sorted_desc.gather(1, (k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if any(p.top_p < 1.0 or p.min_p > 0 for p in params):
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            drop_sorted = self._nucleus(sorted_logits, params).isinf()
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(dim=-1)

    def _nucleus(self, sorted_logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """``sorted_logits`` (each row descending) with the tokens top-p and min-p drop set to -inf."""
        torch = self._torch
        top_ps, min_ps = [p.top_p for p in params], [p.min_p for p in params]
        if any(p < 1.0 for p in top_ps):
            sorted_probs = sorted_logits.softmax(dim=-1)
            # drop a token when the mass before it already reaches top_p (the first token always stays)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            top_p = torch.tensor(top_ps, dtype=sorted_logits.dtype, device=sorted_logits.device).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        if any(p > 0 for p in min_ps):
            # p(token) < min_p p(best)  <=>  logit < best logit + log(min_p); min_p 0 keeps every token
            floor = torch.tensor(
                [math.log(p) if p > 0 else float("-inf") for p in min_ps],
                dtype=sorted_logits.dtype,
                device=sorted_logits.device,
            ).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < sorted_logits[:, :1] + floor, float("-inf"))
        return sorted_logits

    def _fill_logprobs(
        self, logits: torch.Tensor, rows: list[int], seqs: Sequence[SamplingRow], out: list[SampledToken]
    ) -> None:
        torch = self._torch
        index = torch.tensor(rows, device=logits.device)
        logprobs = logits.index_select(0, index).log_softmax(dim=-1)
        chosen = torch.tensor([out[i].token_id for i in rows], device=logits.device)
        chosen_lp = logprobs.gather(1, chosen.unsqueeze(1)).view(-1).tolist()
        max_k = max(seqs[i].params.logprobs or 0 for i in rows)
        if max_k:
            top = logprobs.topk(max_k, dim=-1)
            top_vals, top_ids = top.values.tolist(), top.indices.tolist()
        for j, i in enumerate(rows):
            k = seqs[i].params.logprobs
            out[i].logprob = chosen_lp[j]
            out[i].top = list(zip(top_ids[j][:k], top_vals[j][:k])) if k else []
