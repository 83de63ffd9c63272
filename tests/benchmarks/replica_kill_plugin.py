"""Plugin file for tests/benchmarks/replica_kill.py: backend kind ``bench_fake``, a
FakeBackend answering 40 words at ``BENCH_FAKE_DELAY_S`` (default 0.025) seconds per
word, so a streamed answer lasts about a second (long enough to be cut mid-flight)."""

import os

from tokenops import hookimpl


@hookimpl
def tokenops_register_backends(register):
    from tokenops.testing_gateway import FakeBackend

    reply = " ".join(f"w{i}" for i in range(40))

    def factory(model, settings):
        return FakeBackend(model.name, f"{model.name}#0", reply=reply,
                           delay_s=float(os.environ.get("BENCH_FAKE_DELAY_S", "0.025")))

    register("bench_fake", factory)
