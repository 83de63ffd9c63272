"""End to end: a real ``tokenops serve`` with the demo digits model, driven by the openai SDK."""

import base64
import io
import time
from pathlib import Path

import httpx
import pytest

import tokenops
from tokenops.testing_serve import ServeProcess

from tests.docs_example_checks import first_toml_block

openai = pytest.importorskip("openai")
FOLDER = Path(tokenops.__file__).parent / "demo_models" / "digits-diffusion"
pytestmark = pytest.mark.skipif(not (FOLDER / "model_index.json").is_file(), reason="demo diffusion model not shipped")



def _documented_config() -> str:
    """The ``[[models]]`` example of docs/serve.md's Images section, pointed at the shipped folder."""
    block = first_toml_block(Path(__file__).resolve().parents[2] / "docs" / "serve.md", "## Images")
    assert 'path = "tokenops/demo_models/digits-diffusion"' in block
    return block.replace('path = "tokenops/demo_models/digits-diffusion"', f'path = "{FOLDER}"')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("images"), config=_documented_config()) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def _digits(b64_pngs, native=8):
    """Decode PNGs (scaled up by nearest-neighbour) back to model-size tensors in [-1, 1]."""
    import numpy as np
    import torch
    from PIL import Image

    out = []
    for b64 in b64_pngs:
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))
        step = img.shape[0] // native
        out.append(torch.tensor(img[::step, ::step], dtype=torch.float32) / 127.5 - 1)
    return torch.stack(out).unsqueeze(1), img.shape


def test_generate_a_seven_the_classifier_recognises(client, demo_model):
    result = client.images.generate(model="digits-diffusion", prompt="7", response_format="b64_json", n=4,
                                    size="64x64", extra_body={"seed": 0})
    assert len(result.data) == 4
    images, shape = _digits([d.b64_json for d in result.data])
    assert shape == (64, 64)
    predicted = demo_model.classifier.predict(images).tolist()
    assert predicted.count(7) >= 3, predicted
    extra = result.model_extra["tokenops"]
    assert extra["class"] == 7 and extra["steps"] >= 1 and 0 <= extra["cache_reuse_ratio"] <= 1


def test_same_seed_same_images_and_request_overrides(client):
    kwargs = dict(model="digits-diffusion", prompt="draw a 3", response_format="b64_json")
    a = client.images.generate(**kwargs, extra_body={"seed": 11, "sampler": "ddim", "num_inference_steps": 12,
                                                     "step_cache_threshold": 0})
    b = client.images.generate(**kwargs, extra_body={"seed": 11, "sampler": "ddim", "num_inference_steps": 12,
                                                     "step_cache_threshold": 0})
    assert a.data[0].b64_json == b.data[0].b64_json
    assert a.model_extra["tokenops"]["sampler"] == "ddim" and a.model_extra["tokenops"]["steps"] == 12
    assert a.model_extra["tokenops"]["deep_steps"] == 12
    cached = client.images.generate(**kwargs, extra_body={"seed": 11, "sampler": "ddim", "num_inference_steps": 12,
                                                          "step_cache_threshold": 5})
    assert cached.model_extra["tokenops"]["deep_steps"] < 12


def test_live_tunables_change_the_plan(server, client):
    r = httpx.patch(f"{server.url}/admin/tunables", headers=server.admin_headers,
                    json={"values": {"diffusion.sampler": "ddim", "diffusion.steps": 6}})
    assert r.status_code == 200, r.text
    try:
        result = client.images.generate(model="digits-diffusion", prompt="1", response_format="b64_json")
        assert (result.model_extra["tokenops"]["sampler"], result.model_extra["tokenops"]["steps"]) == ("ddim", 6)
    finally:
        defaults = {t["name"]: t["default"] for t in httpx.get(f"{server.url}/admin/tunables",
                                                              headers=server.admin_headers).json()["tunables"]}
        httpx.patch(f"{server.url}/admin/tunables", headers=server.admin_headers,
                    json={"values": {k: defaults[k] for k in ("diffusion.sampler", "diffusion.steps")}})


@pytest.mark.parametrize("kwargs,needle", [
    ({"prompt": "7", "response_format": "url"}, "only b64_json"),
    ({"prompt": "a cat", "response_format": "b64_json"}, "name one of"),
    ({"prompt": "7", "size": "100x100"}, "size must be"),
    ({"prompt": "7", "style": "vivid"}, "style is not supported"),
    ({"prompt": "7", "quality": "hd"}, "quality"),
    ({"prompt": "7", "n": 11}, "n:"),
])
def test_bad_requests_get_a_400_saying_why(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(model="digits-diffusion", **kwargs)
    assert needle in e.value.message


def test_models_list_shows_the_diffusion_backend(client):
    card = next(m for m in client.models.list().data if m.id == "digits-diffusion")
    assert card.model_extra["backend"] == "diffusion"


def test_chat_on_an_image_model_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="images/generations"):
        client.chat.completions.create(model="digits-diffusion", messages=[{"role": "user", "content": "hi"}])


def test_store_records_image_requests(server, client):
    def image_rows() -> list[dict]:
        r = httpx.get(f"{server.url}/admin/query/images_by_model_hour", headers=server.admin_headers)
        assert r.status_code == 200, r.text
        body = r.json()
        return [dict(zip(body["columns"], row)) for row in body["rows"]]

    # earlier tests' images may already be in the store: wait for these two (telemetry is batched)
    before = sum(row["images"] or 0 for row in image_rows())
    client.images.generate(model="digits-diffusion", prompt="5", response_format="b64_json", n=2,
                           extra_body={"seed": 3, "step_cache_threshold": 5})
    deadline = time.monotonic() + 20
    rows = image_rows()
    while sum(row["images"] or 0 for row in rows) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.25)
        rows = image_rows()
    assert rows and all(row["model"] == "digits-diffusion" for row in rows)
    assert any((row["cache_reuse"] or 0) > 0 for row in rows)
    recent = httpx.get(f"{server.url}/admin/requests", headers=server.admin_headers).json()["requests"]
    image = next(r for r in recent if r["kind"] == "image" and r["status"] == "ok")
    assert image["decisions"]["image"]["steps"] >= 1
    stats = httpx.get(f"{server.url}/admin/stats", headers=server.admin_headers)
    assert stats.status_code == 200 and stats.json()["models"]["digits-diffusion"]["requests"] >= 1
    engine = stats.json()["engines"]["digits-diffusion#0"]
    assert engine["images_total"] >= 2 and engine["diffusion_steps_total"] >= 1
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_the_default_listing_loads_the_image_model_on_its_first_request(tmp_path):
    """A plain ``tokenops serve`` lists digits-diffusion lazily: ready without diffusers imported (it costs
    ~2 s of start), the first image request loads it, concurrent first requests share one load."""
    import concurrent.futures as cf

    with ServeProcess(tmp_path) as srv:
        assert httpx.get(f"{srv.url}/ready", timeout=10).status_code == 200
        listed = httpx.get(f"{srv.base_url}/models", timeout=10).json()["data"]
        assert "digits-diffusion" in [m["id"] for m in listed]
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        with cf.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda seed: client.images.generate(
                model="digits-diffusion", prompt="3", response_format="b64_json", extra_body={"seed": seed}), (0, 1)))
        assert [len(r.data) for r in results] == [1, 1] and results[0].data[0].b64_json != results[1].data[0].b64_json
