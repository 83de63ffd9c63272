"""Plugin file for issue-17 serve tests: backend kind ``boom`` (a FakeBackend that raises a
TypeError, a bug, when the prompt says "boom")."""

from tokenops import hookimpl


@hookimpl
def tokenops_register_backends(register):
    from tokenops.testing_gateway import FakeBackend

    class Boom(FakeBackend):
        async def chat(self, request):
            if "boom" in request.prompt_text():
                raise TypeError("internal detail that must not leak")
            return await super().chat(request)

    def factory(model, settings):
        return Boom(model.name, f"{model.name}#0", reply="alpha beta", delay_s=0.001)

    register("boom", factory)
