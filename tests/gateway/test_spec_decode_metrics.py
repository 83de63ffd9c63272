"""/metrics exposes the engines' speculative-decoding counters (vLLM names, tokenops: prefix)."""

from tokenops.gateway.observability.prometheus import PrometheusMetrics


def test_spec_decode_counters_summed_over_replicas():
    stats = {
        "m": [
            {"num_running": 1, "spec_decode": {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 5}},
            {"num_running": 0, "spec_decode": {"num_drafts": 1, "num_draft_tokens": 4, "num_accepted_tokens": 4}},
        ],
        "plain": [{"num_running": 2}],
    }
    text = PrometheusMetrics().render(stats, ["m", "plain"])
    assert 'tokenops:spec_decode_num_drafts_total{model_name="m"} 4' in text
    assert 'tokenops:spec_decode_num_draft_tokens_total{model_name="m"} 13' in text
    assert 'tokenops:spec_decode_num_accepted_tokens_total{model_name="m"} 9' in text
    assert "# TYPE tokenops:spec_decode_num_drafts_total counter" in text
    assert 'spec_decode_num_drafts_total{model_name="plain"}' not in text  # engines without speculation
