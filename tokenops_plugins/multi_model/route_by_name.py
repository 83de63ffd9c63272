"""Default router: the model the client named, when it is configured."""

from tokenops import hookimpl
from tokenops.types import RouteDecision

TOKENOPS_LAYER = "multi_model"


@hookimpl(trylast=True)
def tokenops_route(request, candidates, profiles):
    if request.model in candidates:
        return RouteDecision(model=request.model, reason="requested", router="route_by_name")
    from tokenops.errors import ModelNotFound

    raise ModelNotFound(request.model, candidates)
