"""Ensembles through the real gateway pipeline with the built-in ensemble plugin."""

from tokenops.config import Settings
from tokenops.testing_gateway import FakeBackend, gateway_client

MSG = [{"role": "user", "content": "What is 6*7?"}]


class Judge(FakeBackend):
    """Answers 41; as a judge it picks candidate 2; as an aggregator it rewrites."""

    def words(self, request):
        text = request.prompt_text()
        if "Candidate answers" in text:
            return ["2"]
        if "Proposal 1" in text:
            return ["Combined: ", "42"]
        return ["41"]


def configure(**conf) -> Settings:
    """``[plugins.ensemble]`` as tokenops.toml gives it: the gateway built from it configures its own plugin."""
    s = Settings()
    s.plugins["ensemble"] = {"members": ["small", "big"], "judge": "big", "aggregator": "big", "samples": 3, **conf}
    return s


async def test_best_of_n_runs_the_judge_and_returns_its_pick():
    settings = configure()
    small, big = FakeBackend("small", reply="42"), Judge("big")
    async with gateway_client({"small": [small], "big": [big]}, settings) as c:
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:best_of_n", "messages": MSG})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].strip() == "41"  # the judge picked candidate 2 (big's answer)
        rec = c.gateway.recent[-1]
        assert rec.decisions["ensemble"]["members"] == ["small", "big"]
        assert rec.decisions["ensemble"]["follow_up"] == "big"
    assert len(big.requests) == 2  # its own answer, then the judging call


async def test_moa_aggregator_writes_final_answer_and_vote_takes_majority():
    settings = configure()
    small, big = FakeBackend("small", reply="42"), Judge("big")
    async with gateway_client({"small": [small], "big": [big]}, settings) as c:
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:moa", "messages": MSG})
        assert r.json()["choices"][0]["message"]["content"].strip() == "Combined: 42"
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:vote", "messages": MSG})
        assert r.json()["choices"][0]["message"]["content"].strip() == "42"
        assert len(small.requests) == 1 + 3  # one moa proposal, three vote samples
        assert small.requests[-1].body["temperature"] == 0.8  # samples are drawn, not greedy
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:nope", "messages": MSG})
        assert r.status_code == 400 and "unknown ensemble" in r.json()["error"]["message"]
