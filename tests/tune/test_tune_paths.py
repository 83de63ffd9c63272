"""One relevance rule for every way `tokenops tune` reaches its server: found through the
store socket of this folder, or given by --url with the admin key, the search space and
the dropped tunables (with their reasons) are the same."""

from __future__ import annotations

from tokenops.slo import parse_slos
from tokenops.testing_serve import ServeProcess
from tokenops.tune.local_server import LocalAdmin
from tokenops.tune.runner import TunePlan, TuneSession
from tokenops.tune.search import Budget


def _space(plan: TunePlan) -> tuple[dict[str, list], dict[str, str]]:
    session = TuneSession(plan)
    try:
        space = session._build_space()
        return {d.name: d.values for d in space.dims}, dict(session.irrelevant)
    finally:
        session.close()


def test_socket_and_url_paths_search_the_same_space(tmp_path):
    # the default server serves a diffusion model too: a chat workload must not search its knobs
    with ServeProcess(tmp_path) as srv:
        local = LocalAdmin.find(str(srv.store_path))
        assert local is not None
        common = {"slos": parse_slos(["p95=1s"]), "budget": Budget.parse("2")}
        by_socket = _space(TunePlan(url=local.url, local_admin=local, **common))
        by_url = _space(TunePlan(url=srv.url, admin_key=srv.admin_key, **common))
    assert by_socket == by_url
    space, dropped = by_url
    assert space and not any(n.startswith(("diffusion.", "routing.", "cascade.", "router.")) for n in space)
    assert "images in the workload" in dropped["diffusion.steps"]
    assert dropped["cascade.threshold"].startswith("needs a cascade")
    assert "routing.replica_policy" in dropped
