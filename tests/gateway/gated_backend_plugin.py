"""A plugin file for `tokenops serve` start-up tests: backend kind ``gated``, a FakeBackend whose
start waits until the file ``engine.gate`` exists (a model "still loading" for as long as a test
wants), then fails with ``engine.fail`` when that is set (a model whose load fails)."""

import asyncio
from pathlib import Path

from tokenops import hookimpl


@hookimpl
def tokenops_register_backends(register):
    from tokenops.testing_gateway import FakeBackend

    class GatedBackend(FakeBackend):
        def __init__(self, model):
            super().__init__(model.name, f"{model.name}#0", reply="alpha beta", delay_s=0.005)
            self.gate = model.engine.get("gate")
            self.fail = model.engine.get("fail")

        async def start(self):
            while self.gate and not Path(self.gate).exists():
                await asyncio.sleep(0.05)
            if self.fail:
                raise RuntimeError(self.fail)
            await super().start()

    register("gated", lambda model, settings: GatedBackend(model))
