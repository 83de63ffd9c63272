"""A plugin file for `tokenops serve` subprocess tests: backend kind ``fake`` (FakeBackend, 5 ms per token)."""

from tokenops import hookimpl


@hookimpl
def tokenops_register_backends(register):
    from tokenops.testing_gateway import FakeBackend

    def factory(model, settings):
        return FakeBackend(model.name, f"{model.name}#0", reply="alpha beta gamma delta", delay_s=0.005)

    register("fake", factory)
