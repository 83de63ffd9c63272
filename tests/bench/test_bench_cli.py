"""``tokenops bench`` and ``tokenops bench compare`` end to end against the fake server."""

import json

import pytest
from fake_server import FakeEngine, FakeServer
from typer.testing import CliRunner

from tokenops.cli import build_app


@pytest.fixture(scope="module")
def server():
    with FakeServer(FakeEngine(base_s=0.005, per_token_s=0.0002, max_num_seqs=4)) as s:
        yield s


def _bench(args):
    return CliRunner().invoke(build_app(), ["bench", *args], catch_exceptions=False)


def test_bench_rate_sweep_json_store_plot_and_compare(server, tmp_path):
    store = str(tmp_path / "t.duckdb")
    common = ["--url", server.url, "-n", "12", "--input-len", "8", "--output-len", "6", "--slo", "p95=150ms",
              "--store", store]
    r = _bench([*common, "--rate", "10,40", "--json", "--plot", str(tmp_path / "p.html")])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [lv["label"] for lv in data["levels"]] == ["rate 10/s", "rate 40/s"]
    s = data["levels"][0]["summary"]
    assert s["num_completed"] == 12 and s["total_output_tokens"] == 72
    assert s["slo"][0]["label"] == "ttft_p95=150ms" and 0 <= s["attainment"] <= 1
    html = (tmp_path / "p.html").read_text()
    assert "<svg" in html and "rate 40/s" in html
    (tmp_path / "a.json").write_text(r.stdout)

    r2 = _bench([*common, "--concurrency", "2"])
    assert r2.exit_code == 0, r2.output
    assert "good/s" in r2.stdout and "saved to" in r2.stdout
    run_id = r2.stdout.split("bench_runs id ")[1].split(")")[0]

    cmp = CliRunner().invoke(build_app(), ["bench", "compare", str(tmp_path / "a.json"), run_id, "--store", store,
                                           "--json"])
    assert cmp.exit_code == 0, cmp.output
    rows = json.loads(cmp.stdout)["rows"]
    req = next(x for x in rows if x["figure"] == "req/s")
    assert req["a"] > 0 and req["b"] > 0 and req["change"] == pytest.approx((req["b"] - req["a"]) / req["a"])


def test_bench_user_errors_are_one_line(server):
    from tokenops.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--url", server.url, "--rate", "1", "--concurrency", "2", "--no-store"])
    assert e.value.code == 2
    r = CliRunner().invoke(build_app(), ["bench", "--url", server.url, "--rate", "x", "--no-store"])
    assert r.exit_code != 0


def test_bench_file_workload_sends_the_files_requests(server, tmp_path, capsys):
    data = tmp_path / "reqs.jsonl"
    data.write_text('{"prompt": "a b c d", "output_tokens": 3}\n{"prompt": "e f", "output_tokens_count": 5}\n')
    r = _bench(["--url", server.url, "-w", "file", "--dataset", str(data), "-n", "4", "--concurrency", "1",
                "--no-store", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["levels"][0]["summary"]
    assert s["num_completed"] == 4 and s["total_output_tokens"] == 3 + 5 + 3 + 5
    assert s["total_input_tokens"] == 4 + 2 + 4 + 2  # the fake server counts prompt words
    from tokenops.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--url", server.url, "-w", "file", "--no-store"])
    assert e.value.code == 2 and "needs --dataset" in capsys.readouterr().err
