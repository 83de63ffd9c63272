"""The shipped LoRA adapters (``tokenops/demo_models/adapters/``, trained by
``scripts/train_lora_adapters.py``) on the default model through a real ``tokenops serve``
(``--lora NAME=FOLDER``), driven by the openai SDK: an adapter by name, streamed and with a forced
tool call; the profile router sends ``auto`` to an adapter; and (slow) an adapter beats the base on
held-out items of its own suite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest
from real_model import MODEL, SERVE_ENV, serve_args

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = REPO / "tokenops" / "demo_models" / "adapters"
NAMES = ("smollm2-math", "smollm2-instruction", "smollm2-code")


#: The profile router on ``auto``: each adapter best on its own suite (the shape of the measured profiles,
#: docs/lora.md), the base best elsewhere.
ROUTER = '[plugins.router]\nuse = "profile"\n[plugins.router.profile]\nthreshold = 1.0\nmax_error_rate = 1.0\n'


def _profiles(folder: Path) -> None:
    from tokenops_plugins.multi_model._profiles import save_profile

    own = {"smollm2-math": "math", "smollm2-instruction": "instruction", "smollm2-code": "code"}
    for model in (MODEL, *NAMES):
        dims = {d: {"score": (0.9 if own.get(model) == d else 0.1) if d in own.values() else
                    (0.9 if model == MODEL else 0.5), "n": 20} for d in ("math", "instruction", "code", "extraction")}
        save_profile({"model": model, "dimensions": dims}, folder)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    args = serve_args() + [a for name in NAMES for a in ("--lora", f"{name}={ADAPTERS / name}")]
    workdir = tmp_path_factory.mktemp("lora_real")
    _profiles(workdir / "profiles" / "models")
    with ServeProcess(workdir, config=ROUTER, args=args, env=SERVE_ENV, store=False, ready_timeout_s=600) as srv:
        yield srv


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)


def test_shipped_adapters_are_small_peft_folders():
    sizes = {n: (ADAPTERS / n / "adapter_model.safetensors").stat().st_size for n in NAMES}
    for name in NAMES:
        cfg = json.loads((ADAPTERS / name / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA" and cfg["base_model_name_or_path"] == MODEL
    assert sum(sizes.values()) < 6 * 2**20, sizes


def test_adapter_by_name_streamed_and_forced_tool_call(served):
    client = _client(served)
    cards = {m.id: m for m in client.models.list().data}
    assert all(cards[n].model_extra["parent"] == MODEL for n in NAMES)
    prompt = "Write exactly 4 words, all in uppercase, and make the first word 'harbor'. No punctuation."
    stream = client.chat.completions.create(model="smollm2-instruction", messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks and all(c.model == "smollm2-instruction" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split()[0] == "HARBOR", text  # the adapter's answer shape (the base opens with prose)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    tool = {"type": "function", "function": {"name": "convert", "description": "Convert an amount of money.",
                                             "parameters": {"type": "object", "properties": {
                                                 "amount": {"type": "number"},
                                                 "currency": {"type": "string", "enum": ["EUR", "USD", "JPY"]}},
                                                 "required": ["amount", "currency"]}}}
    out = client.chat.completions.create(
        model="smollm2-math", messages=[{"role": "user", "content": "Convert 12 dollars to euros."}],
        temperature=0, max_tokens=40, tools=[tool], tool_choice={"type": "function", "function": {"name": "convert"}})
    assert out.model == "smollm2-math"
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "convert"
    args = json.loads(call.function.arguments)
    assert isinstance(args["amount"], (int, float)) and args["currency"] in {"EUR", "USD", "JPY"}


def test_profile_router_sends_auto_to_the_adapter_of_the_prompts_dimension(served):
    from tokenops_plugins.multi_model._suites import make_suite

    client = _client(served)
    for dimension, want in (("math", "smollm2-math"), ("extraction", MODEL)):
        task = make_suite(dimension, 1, seed=0)[0]
        out = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": task.prompt}],
                                             temperature=0, max_tokens=2)
        assert out.model == want, (dimension, out.model)


@pytest.mark.slow
def test_an_adapter_beats_the_base_on_its_held_out_items(served):
    sys.path.insert(0, str(REPO / "tests" / "benchmarks"))
    from lora_quality import score

    # docs/lora.md: code 28/30 against the base's 9/30 (15 items here: a margin of 3 is far inside that)
    table = score(_client(served), [MODEL, "smollm2-code"], ["code"], n=15, workers=8)
    assert table["smollm2-code"]["code"][0] >= table[MODEL]["code"][0] + 3, table
