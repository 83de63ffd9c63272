"""``[[models]] backend = "diffusion"`` with ``engine = { load = "lazy" }``: loaded on first use, once."""

import asyncio
from pathlib import Path

import pytest

import tokenops
from tokenops.backends.diffusion import DiffusionBackend
from tokenops.config import ConfigError, ModelConfig, Settings
from tokenops.types import BackendError

FOLDER = Path(tokenops.__file__).parent / "demo_models" / "digits-diffusion"


def _backend(path, **engine) -> DiffusionBackend:
    return DiffusionBackend(ModelConfig(name="d", backend="diffusion", path=str(path), engine=engine), Settings())


def test_lazy_is_ready_before_loading_and_loads_once(monkeypatch):
    from tokenops.diffusion import model as model_mod

    loads = []

    def fake_load(path):
        loads.append(path)
        return object()

    monkeypatch.setattr(model_mod.DiffusionModel, "load", staticmethod(fake_load))
    backend = _backend(FOLDER, load="lazy")

    async def run():
        await backend.start()
        assert backend.ready and backend.pipeline is None and loads == []
        first, second = await asyncio.gather(backend.ensure_loaded(), backend.ensure_loaded())
        assert first is second is backend.pipeline
        assert loads == [str(FOLDER)]

    asyncio.run(run())


def test_start_loads_by_default(monkeypatch):
    from tokenops.diffusion import model as model_mod

    monkeypatch.setattr(model_mod.DiffusionModel, "load", staticmethod(lambda path: "pipeline"))
    backend = _backend(FOLDER)
    assert not backend.ready
    asyncio.run(backend.start())
    assert backend.pipeline == "pipeline"


def test_a_lazy_model_that_fails_to_load_is_a_503_naming_the_folder(tmp_path):
    backend = _backend(tmp_path / "missing", load="lazy")

    with pytest.raises(BackendError) as info:
        asyncio.run(backend.ensure_loaded())
    assert info.value.status == 503 and "missing" in str(info.value)


@pytest.mark.parametrize("engine, needle", [({"load": "later"}, "load = 'later'"), ({"threads": 2}, "threads")])
def test_unknown_engine_options_are_refused(engine, needle):
    with pytest.raises(ConfigError, match=needle):
        _backend(FOLDER, **engine)
