"""Issue 21: the quality filter of captured pairs (no ground truth needed).

Capture keeps each answer's ``finish_reason`` and the teacher's mean token logprob (asked of
the backend through ``tokenops_wants_logprobs``, hidden from a client that did not ask);
``tokenops distill export|train|eval --min-confidence P`` keeps pairs whose
``exp(mean logprob) >= P`` and drops truncated answers unless ``--keep-truncated``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
LARGE = REPO / "tokenops" / "demo_models" / "ladder-large"

# the capture block documented in docs/distillation.md, with the quality keys
CONFIG = f"""
[[models]]
name = "ladder-large"
path = "{LARGE}"

[gateway]
api_keys = {{ "key-acme" = "acme" }}

[plugins.distill_capture]
models = ["ladder-large"]
tenants = ["acme"]
retention_days = 30
max_rows = 100000
logprobs = true
min_confidence = 0.0

[plugins.semantic_cache]
embedder = "lexical"
"""

def test_documented_capture_block_is_the_one_tested():
    """Every key line of docs/distillation.md's [plugins.distill_capture] example is in CONFIG."""
    import re
    import tomllib

    doc = (REPO / "docs" / "distillation.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if "[plugins.distill_capture]" in b)
    documented = tomllib.loads(block)["plugins"]["distill_capture"]
    tested = tomllib.loads(CONFIG)["plugins"]["distill_capture"]
    assert documented == tested
    assert {"logprobs", "min_confidence"} <= set(documented)


PROMPT = 'Extract a JSON object with keys "name" and "city" from: "Dana moved to Oslo." Reply with JSON only.'


def _rows(store_path: Path, n: int) -> dict[str, tuple]:
    from tokenops.store import open_store

    deadline = time.monotonic() + 60  # the telemetry writer flushes in batches; a loaded machine is slow
    while True:
        with open_store(store_path) as s:
            rows = s.execute("SELECT id, answer, finish_reason, mean_logprob, num_logprobs, completion_tokens "
                             "FROM distill_pairs").fetchall()
        if len(rows) >= n or time.monotonic() > deadline:
            return {r[1]: r for r in rows}
        time.sleep(0.3)


def _cache_hits(store_path: Path, n: int) -> list[bool]:
    from tokenops.store import open_store

    deadline = time.monotonic() + 60
    while True:
        with open_store(store_path) as s:
            hits = [bool(r[0]) for r in s.execute("SELECT cache_hit FROM requests ORDER BY ts").fetchall()]
        if len(hits) >= n or time.monotonic() > deadline:
            return hits
        time.sleep(0.3)


def test_capture_keeps_finish_reason_and_confidence_through_serve(tmp_path):
    from tokenops.cli import build_app

    with ServeProcess(tmp_path, config=CONFIG) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="key-acme")
        msgs = [{"role": "user", "content": PROMPT}]
        plain = client.chat.completions.create(model="ladder-large", max_tokens=48, temperature=0, messages=msgs)
        assert plain.choices[0].logprobs is None  # the client did not ask: the gateway's logprobs are hidden
        cut = client.chat.completions.create(model="ladder-large", max_tokens=2, temperature=0,
                                             messages=[{"role": "user", "content": "Tell me a long story."}])
        assert cut.choices[0].finish_reason == "length"
        chunks = list(client.chat.completions.create(model="ladder-large", max_tokens=32, temperature=0, stream=True,
                                                     messages=[{"role": "user", "content": "What is 2 + 3?"}]))
        assert all(c.choices[0].logprobs is None for c in chunks if c.choices)  # hidden from the stream too
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        asked = client.chat.completions.create(model="ladder-large", max_tokens=32, temperature=0, logprobs=True,
                                               messages=[{"role": "user", "content": "Name a colour."}])
        client_lps = [t.logprob for t in asked.choices[0].logprobs.content]  # the client asked: it gets them

        answers = [plain.choices[0].message.content, cut.choices[0].message.content, streamed,
                   asked.choices[0].message.content]
        assert len(set(answers)) == 4, answers  # rows are matched to requests by their answer
        rows = _rows(srv.store_path, 4)
        assert sorted(rows) == sorted(answers), rows
        for answer, (_, _, finish, mean, num, completion) in rows.items():
            assert finish in ("stop", "length") and mean is not None and mean <= 0 and num >= 1, (answer, finish, mean)
        assert rows[plain.choices[0].message.content][2] == plain.choices[0].finish_reason
        assert rows[plain.choices[0].message.content][4] == plain.usage.completion_tokens
        assert rows[cut.choices[0].message.content][2] == "length"
        assert rows[streamed][4] >= 1  # a streamed answer's logprobs are collected from its deltas
        assert rows[asked.choices[0].message.content][3] == pytest.approx(sum(client_lps) / len(client_lps), abs=1e-4)

        # the logprobs the gateway asked for neither change the semantic cache's key nor leak through it
        again = client.chat.completions.create(model="ladder-large", max_tokens=48, temperature=0, messages=msgs)
        chunks = list(client.chat.completions.create(model="ladder-large", max_tokens=32, temperature=0, stream=True,
                                                     messages=[{"role": "user", "content": "What is 2 + 3?"}]))
        assert again.choices[0].message.content == plain.choices[0].message.content
        assert again.choices[0].logprobs is None and all(c.choices[0].logprobs is None for c in chunks if c.choices)
        hits = _cache_hits(srv.store_path, 6)
        assert hits[-2:] == [True, True], hits

        # the filters, while the server holds the store
        res = CliRunner().invoke(build_app(), ["distill", "status", "--store", str(srv.store_path), "--json",
                                               "--min-confidence", "0.999999"])
        assert res.exit_code == 0, res.output
        (st,) = json.loads(res.output)["pairs"]
        truncated = sum(r[2] == "length" for r in rows.values())
        assert st["count"] == 4 and st["not_truncated"] == 4 - truncated and st["with_logprobs"] == 4
        assert st["confident"] == sum(math.exp(r[3]) >= 0.999999 for r in rows.values()) < 4
        out = tmp_path / "pairs.jsonl"
        res = CliRunner().invoke(build_app(), ["distill", "export", "--store", str(srv.store_path), "-o", str(out),
                                               "--json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.output)
        assert (data["pairs"], data["filter"]["truncated"]) == (4 - truncated, truncated)
        answers = [json.loads(x)["messages"][-1]["content"] for x in out.read_text().splitlines()]
        assert cut.choices[0].message.content not in answers


# -- the filter on a store (no server) --------------------------------------------------------

ROWS = [  # id, answer, finish_reason, mean_logprob
    ("a", "confident", "stop", math.log(0.9)),
    ("b", "unsure", "stop", math.log(0.3)),
    ("c", "cut off", "length", math.log(0.95)),
    ("d", "no logprobs", "stop", None),
    ("e", "older capture", None, None),  # captured before migration 8
]


@pytest.fixture()
def store_path(tmp_path) -> Path:
    from tokenops.store import Store

    path = tmp_path / "tokenops.duckdb"
    with Store.open(path) as store:
        for rid, answer, finish, mean in ROWS:
            store.execute("INSERT INTO distill_pairs (id, ts, tenant, model, messages, answer, finish_reason, "
                          "mean_logprob) VALUES (?, now()::TIMESTAMP, 'acme', 'ladder-large', ?, ?, ?, ?)",
                          [rid, json.dumps([{"role": "user", "content": f"q {rid}"}]), answer, finish, mean])
    return path


def test_quality_filter_on_a_store(store_path):
    from tokenops.store import Store
    from tokenops_plugins.distill._pairs import load, quality_filter

    with Store.open(store_path) as s:
        pairs = load(s)
    kept, counts = quality_filter(pairs)
    assert [p.id for p in kept] == ["a", "b", "d", "e"] and counts.truncated == 1
    kept, counts = quality_filter(pairs, min_confidence=0.5)
    assert [p.id for p in kept] == ["a", "d", "e"]
    assert (counts.total, counts.kept, counts.truncated, counts.below_confidence, counts.without_logprobs) == (5, 3, 1, 1, 2)
    kept, _ = quality_filter(pairs, min_confidence=0.5, keep_truncated=True)
    assert [p.id for p in kept] == ["a", "c", "d", "e"]
    assert pairs[0].confidence == pytest.approx(0.9)


def test_cli_filters_and_one_line_errors(store_path, tmp_path, capsys):
    from tokenops.cli import build_app, main

    out = tmp_path / "x.jsonl"
    res = CliRunner().invoke(build_app(), ["distill", "export", "--store", str(store_path), "-o", str(out),
                                           "--min-confidence", "0.5"])
    assert res.exit_code == 0, res.output
    assert "kept 3 of 5 pairs; 1 truncated dropped; 1 below confidence 0.5 dropped, 2 without logprobs kept" in res.output
    assert [json.loads(x)["messages"][-1]["content"] for x in out.read_text().splitlines()] == \
        ["confident", "no logprobs", "older capture"]
    res = CliRunner().invoke(build_app(), ["distill", "status", "--store", str(store_path), "--min-confidence", "0.5",
                                           "--json"])
    (st,) = json.loads(res.output)["pairs"]
    assert (st["count"], st["not_truncated"], st["with_logprobs"], st["confident"], st["kept"]) == (5, 4, 3, 4, 3)
    for argv in (["distill", "export", "--store", str(store_path), "-o", str(out), "--min-confidence", "1.5"],
                 ["distill", "train", "--teacher", "ladder-large", "--student", "ladder-small", "--store",
                  str(store_path), "--min-confidence", "-0.1"],
                 ["distill", "train", "--teacher", "ladder-large", "--student", "ladder-small", "--store",
                  str(store_path), "--min-confidence", "0.99", "--heldout", "0", "--limit", "1", "--steps", "1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "no training pairs left after the quality filter" in err


def test_capture_config_and_min_confidence_at_capture(monkeypatch):
    from tokenops.config import ConfigError
    from tokenops.types import GatewayRequest, GatewayResponse
    from tokenops_plugins.distill import capture

    for bad in ({"min_confidence": 1.5}, {"min_confidence": "high"}, {"logprobs": "yes"},
                {"min_confidence": 0.5, "logprobs": False}):
        with pytest.raises(ConfigError, match=r"\[plugins.distill_capture\]"):
            capture.parse_config({"models": ["m"], "tenants": ["t"], **bad})
    plugin = capture.DistillCapture()  # an instance carries its own config
    plugin.config = capture.parse_config({"models": ["m"], "tenants": ["t"], "min_confidence": 0.5})
    recorded = []

    class _Hook:
        def tokenops_record(self, event):
            recorded.append(event.data)

    class _PM:
        hook = _Hook()

    monkeypatch.setattr("tokenops.plugin_manager.get_plugin_manager", lambda: _PM())
    request = GatewayRequest(kind="chat", model="m", tenant="t", messages=[{"role": "user", "content": "q"}], body={})
    assert plugin.tokenops_wants_logprobs(request=request, model="m")
    other_model = GatewayRequest(kind="chat", model="x", tenant="t", messages=request.messages, body={})
    other_tenant = GatewayRequest(kind="chat", model="m", tenant="u", messages=request.messages, body={})
    assert not plugin.tokenops_wants_logprobs(request=other_model, model="x")
    assert not plugin.tokenops_wants_logprobs(request=other_tenant, model="m")
    plugin.tokenops_cache_store(request, GatewayResponse("low", "m", token_logprobs=[math.log(0.2)] * 3))
    plugin.tokenops_cache_store(request, GatewayResponse("high", "m", token_logprobs=[math.log(0.8)] * 3))
    plugin.tokenops_cache_store(request, GatewayResponse("none", "m"))  # no logprobs: kept
    assert [r["answer"] for r in recorded] == ["high", "none"]
    assert recorded[0]["mean_logprob"] == pytest.approx(math.log(0.8)) and recorded[0]["num_logprobs"] == 3
    assert recorded[1]["mean_logprob"] is None and recorded[1]["finish_reason"] == "stop"
    assert (plugin.num_captured, plugin.num_below_confidence) == (2, 1)
    plugin.config = capture.parse_config({"models": ["m"], "tenants": ["t"], "logprobs": False})
    assert not plugin.tokenops_wants_logprobs(request=request, model="m")


def test_kd_loss_rows_mask():
    """Logit KD only on the rows it is asked for (replayed student answers get cross-entropy only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tokenops_plugins.distill._kd import KDConfig, kd_loss

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    student, teacher = LlamaForCausalLM(config), LlamaForCausalLM(config)
    ids = torch.randint(5, 64, (3, 10))
    att = torch.ones_like(ids)
    labels = torch.full_like(ids, -100)
    labels[:, 6:] = ids[:, 6:]
    cfg = KDConfig(kd_weight=0.5)
    _, ce, kl_all = kd_loss(student, teacher, ids, att, labels, cfg)
    _, ce2, kl_mask_all = kd_loss(student, teacher, ids, att, labels, cfg, torch.tensor([True, True, True]))
    assert kl_all > 0 and kl_mask_all == pytest.approx(kl_all, rel=1e-5) and ce2 == pytest.approx(ce)
    loss, _, kl_none = kd_loss(student, teacher, ids, att, labels, cfg, torch.tensor([False, False, False]))
    assert kl_none == 0.0 and loss.item() == pytest.approx(ce)
    _, _, kl_one = kd_loss(student, teacher, ids, att, labels, cfg, torch.tensor([True, False, False]))
    _, _, kl_first = kd_loss(student, teacher, ids[:1], att[:1], labels[:1], cfg)
    assert kl_one == pytest.approx(kl_first, rel=1e-4)


def test_train_replays_dropped_prompts(store_path, tmp_path):
    from tokenops.cli import build_app

    out = tmp_path / "distilled"
    res = CliRunner().invoke(build_app(), ["distill", "train", "--teacher", "ladder-large", "--student", "ladder-small",
                                           "--store", str(store_path), "--out", str(out), "--steps", "1",
                                           "--batch-size", "4", "--heldout", "0", "--min-confidence", "0.5",
                                           "--replay-dropped", "--kd-weight", "0", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    # kept: a, d, e; dropped: b (below 0.5) and c (truncated), answered by the student itself
    assert (info["pairs"], info["replayed"], info["filter"]["kept"]) == (3, 2, 3)
    assert (out / "config.json").exists()
