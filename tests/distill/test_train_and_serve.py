"""Issue 21: a tiny ``tokenops distill train`` run (few steps, resumable) writes a loadable HF
folder, and ``tokenops serve`` takes it both as a model of its own and as the speculative
draft of its teacher (the config documented in docs/distillation.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]

PAIRS = [("Compute (3 + 4) + 1. Reply with the number only.", "8"),
         ('Extract a JSON object with keys "name", "city" and "age" (integer) from: "Hana moved to Riga last spring '
          'and turned 30 in May." Reply with JSON only.', '{"name": "Hana", "city": "Riga", "age": 30}'),
         ("Write exactly 3 words, all in lowercase, and make the first word 'river'. No punctuation.",
          "river stone cloud")]


@pytest.fixture(scope="module")
def store_with_pairs(tmp_path_factory) -> Path:
    from tokenops.store import Store

    path = tmp_path_factory.mktemp("distill") / "tokenops.duckdb"
    with Store.open(path) as store:
        for i, (prompt, answer) in enumerate(PAIRS * 4):
            store.execute("INSERT INTO distill_pairs (id, ts, tenant, model, messages, answer, prompt_tokens, "
                          "completion_tokens) VALUES (?, now()::TIMESTAMP, 'acme', 'ladder-large', ?, ?, 10, 5)",
                          [f"req-{i}", json.dumps([{"role": "user", "content": prompt}]), answer])
    return path


def _info(output: str) -> dict:
    return json.loads(re.search(r'\{"steps".*\}', output).group(0))


@pytest.fixture(scope="module")
def distilled(store_with_pairs) -> Path:
    from tokenops.cli import build_app

    out = store_with_pairs.parent / "distilled" / "tiny"
    base = ["distill", "train", "--teacher", "ladder-large", "--student", "ladder-small", "--store",
            str(store_with_pairs), "--out", str(out), "--batch-size", "4", "--heldout", "0", "--json"]
    res = CliRunner().invoke(build_app(), base + ["--steps", "2"])
    assert res.exit_code == 0, res.output
    assert _info(res.output)["steps"] == 2
    res = CliRunner().invoke(build_app(), base + ["--steps", "4", "--resume"])  # continues from checkpoint.pt
    assert res.exit_code == 0, res.output
    info = _info(res.output)
    assert info["steps"] == 4 and info["pairs"] == 12 and info["logit_kd"] is True
    return out


def test_distilled_folder_loads_and_differs_from_the_student(distilled):
    import torch
    from transformers import AutoModelForCausalLM

    after = AutoModelForCausalLM.from_pretrained(distilled)
    before = AutoModelForCausalLM.from_pretrained(REPO / "tokenops" / "demo_models" / "ladder-small")
    assert (distilled / "tokenizer.json").exists()
    changed = [n for (n, a), (_, b) in zip(after.named_parameters(), before.named_parameters()) if not torch.equal(a, b)]
    assert changed, "training changed no weight"


def test_train_errors_are_one_line(tmp_path):
    from tokenops.cli import main

    with pytest.raises(SystemExit) as e:
        main(["distill", "train", "--teacher", "ladder-large", "--student", "no-such-model", "--store",
              str(tmp_path / "s.duckdb")])
    assert e.value.code == 2


def _docs_config(distilled: Path) -> str:
    """The config block of docs/distillation.md, pointed at the test's folder."""
    text = (REPO / "docs" / "distillation.md").read_text()
    block = re.search(r"```toml\n(# serve the distilled student.*?)```", text, re.S).group(1)
    return block.replace("store/distilled/ladder-small-from-ladder-large", str(distilled)).replace(
        "tokenops/demo_models/ladder-large", str(REPO / "tokenops" / "demo_models" / "ladder-large"))


def test_serve_takes_the_distilled_model_and_draft(distilled, tmp_path):
    with ServeProcess(tmp_path, config=_docs_config(distilled)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        names = {m.id for m in client.models.list()}
        assert {"ladder-small-distilled", "ladder-large"} <= names
        for model in ("ladder-small-distilled", "ladder-large", "cascade"):
            out = client.chat.completions.create(model=model, max_tokens=12, temperature=0,
                                                 messages=[{"role": "user", "content": PAIRS[0][0]}])
            assert out.choices[0].message.content is not None
        import httpx

        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=10).json()
        assert "spec_decode" in json.dumps(stats)  # the teacher runs with the distilled draft


def test_eval_reports_before_after_on_suites_and_captured_traffic(distilled, store_with_pairs):
    from tokenops.cli import build_app

    res = CliRunner().invoke(build_app(), ["distill", "eval", "--distilled", str(distilled), "--store",
                                           str(store_with_pairs), "-n", "2", "--dimensions", "math,extraction",
                                           "--heldout", "0.5", "--no-acceptance", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(re.search(r'\{"suites".*\}', res.output).group(0))
    assert set(report["suites"]) == {"before", "after", "teacher"}
    assert set(report["suites"]["after"]) == {"math", "extraction"}
    traffic = report["traffic"]["after"]
    assert traffic["n"] > 0 and 0.0 <= traffic["token_agreement"] <= 1.0
