"""``POST /v1/images/generations``: OpenAI's image endpoint, served by ``diffusion`` backends.

Validated like OpenAI's, then admit -> the named (or first) diffusion model's
replica -> ``backend.generate_images`` -> record. Every field acts or gets a 400:

- ``prompt`` names what to draw (the demo digits model: "7", "draw a 7", "seven");
- ``n`` (1-10) images, ``size`` ``WxH`` (the model's native size or a whole multiple of
  it up to 1024, scaled with nearest-neighbour; ``auto`` or absent = native);
- ``response_format`` ``b64_json`` (``url`` is refused: this server keeps no files),
  ``output_format`` ``png``; ``user`` is the session/tenant as for chat;
- ``background`` ``auto``/``opaque``, ``quality`` ``auto``, ``moderation`` ``auto``/``low``
  (nothing is filtered), ``stream`` false: other values get a 400 saying why;
- extensions: ``seed`` (reproducible images), ``sampler`` (ddpm | ddim | dpm),
  ``num_inference_steps``, ``step_cache_threshold`` (0 turns the step cache off) —
  they override the ``diffusion_sampler`` / ``step_cache`` plugins' plan for this request.

The answer is ``{created, data: [{b64_json}], output_format, size, tokenops: {...}}``
where ``tokenops`` tells the class drawn, the plan run, the steps run and the step
cache's reuse ratio. Each request is one ``requests`` row (kind ``image``) and one
``image_requests`` row in the store.
"""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from tokenops.gateway.core import hooks
from tokenops.gateway.core.capability import choose_capable_replica
from tokenops.gateway.errors import APIError
from tokenops.gateway.intake import caller, read_caller_body, stamp
from tokenops.json_types import INTEGRAL_FLOAT
from tokenops.types import BackendError, BackendOutcome, GatewayRequest, TelemetryEvent

MAX_IMAGES = 10
MAX_SIDE = 1024
_JSON = "application/json"
#: OpenAI fields this server cannot honour, with the reason the 400 gives.
_REFUSED = {
    "style": "style applies to dall-e-3 only; the diffusion backend has no style control",
    "output_compression": "output_compression applies to jpeg/webp; this server returns png",
    "partial_images": "partial images need streaming, which this endpoint does not do",
    "input_fidelity": "input_fidelity applies to image edits, not generations",
}

router = APIRouter()


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1, max_length=32000)
    model: str | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_IMAGES), INTEGRAL_FLOAT] = Field(1)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    user: str | None = None
    background: Literal["auto", "opaque", "transparent"] | None = None
    quality: Literal["auto", "standard", "hd", "low", "medium", "high"] | None = None
    moderation: Literal["auto", "low"] | None = None
    stream: bool | None = None
    # tokenops extensions
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1), INTEGRAL_FLOAT] | None = Field(None)
    sampler: Literal["ddpm", "ddim", "dpm"] | None = None
    num_inference_steps: Annotated[int, Field(strict=True, ge=1, le=10_000), INTEGRAL_FLOAT] | None = Field(None)
    step_cache_threshold: float | None = Field(None, ge=0.0, le=100.0, strict=True)


def parse_request(data: Any) -> ImageGenerationRequest:
    """The validated request, or an :class:`APIError` 400 naming the field and why."""
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_value")
    for name, why in _REFUSED.items():
        if data.get(name) is not None:
            raise APIError(400, f"{name} is not supported: {why}", code="unsupported_parameter", param=name)
    try:
        req = ImageGenerationRequest.model_validate(data, strict=True)  # JSON types as sent: 0 is no bool
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        message = f"{loc}: {err.get('msg', 'invalid value')}"
        if err.get("type") == "extra_forbidden":
            message = f"{loc} is not a field of /v1/images/generations"
        raise APIError(400, message, code="invalid_value", param=loc or None) from None
    checks = (
        (
            "response_format",
            req.response_format == "url",
            "only b64_json is served: this server stores no image files to link to; send response_format=b64_json",
        ),
        ("output_format", req.output_format not in (None, "png"), "only png is produced"),
        ("background", req.background == "transparent", "the diffusion model draws opaque images"),
        (
            "quality",
            req.quality not in (None, "auto"),
            "quality levels are not modelled; choose speed/quality with sampler and num_inference_steps",
        ),
        ("stream", bool(req.stream), "image streaming is not supported; send stream=false or omit it"),
    )
    for param, is_bad, why in checks:
        if is_bad:
            raise APIError(400, f"{param}: {why}", code="unsupported_parameter", param=param)
    return req


def parse_size(size: str | None, native: tuple[int, int]) -> tuple[int, int]:
    """``(width, height)``: native for None/``auto``, else a whole multiple of the native size."""
    if size is None or size == "auto":
        return native
    match = re.fullmatch(r"(\d+)x(\d+)", size)
    width, height = native
    if match:
        w, h = int(match[1]), int(match[2])
        if w % width == 0 and h % height == 0 and w // width == h // height and 1 <= w <= MAX_SIDE and h <= MAX_SIDE:
            return w, h
    examples = ", ".join(f"{width * k}x{height * k}" for k in (1, 2, 32) if width * k <= MAX_SIDE)
    raise APIError(
        400,
        f"size must be 'auto' or WxH, the model's native {width}x{height} times a whole number, at "
        f"most {MAX_SIDE} a side (e.g. {examples}); got {size!r}",
        code="invalid_value",
        param="size",
    )


def diffusion_models(pipeline: Any) -> list[str]:
    return [m for m, rs in pipeline.replicas.items() if rs and getattr(rs[0].backend, "kind", None) == "diffusion"]


@router.post(
    "/v1/images/generations",
    tags=["openai"],
    summary="Create images (b64_json) with a diffusion model",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}},
        }
    },
)
async def create_images(request: Request) -> Response:
    from tokenops.gateway.edge.body import parse_json

    who = caller(request)
    gw = who.gateway
    req = parse_request(parse_json(await read_caller_body(request, who)))
    models = diffusion_models(gw.pipeline)
    model = req.model or (models[0] if models else "")
    greq = GatewayRequest(
        kind="image",
        model=model,
        body=req.model_dump(exclude_unset=True),
        prompt=req.prompt,
        session_id=req.user,
        max_tokens=0,
    )
    stamp(greq, who)
    answer = await generate(gw, greq, req, models)
    return Response(json.dumps(answer, separators=(",", ":")), media_type=_JSON, headers=greq.response_headers or None)


async def generate(gw: Any, greq: GatewayRequest, req: ImageGenerationRequest, models: list[str]) -> dict[str, Any]:
    """Answer one image request; the ``requests`` and ``image_requests`` rows are written whatever the outcome."""
    from tokenops.backends.diffusion import ImageRequest

    pipeline = gw.pipeline
    rec = pipeline.new_record(greq)
    image: dict[str, Any] = {"n": req.n, "size": req.size}
    try:
        with pipeline.tracked(rec):
            await pipeline.admit(greq)
            if not greq.model:
                raise APIError(
                    400,
                    'no diffusion model is configured: add [[models]] backend = "diffusion" with path = '
                    "a diffusers pipeline folder",
                    code="model_not_found",
                    param="model",
                )
            replica = choose_capable_replica(
                pipeline,
                greq,
                rec,
                reason="images",
                method="generate_images",
                does="generate images",
                use="a diffusion model",
                alternatives=models,
            )
            await replica.backend.ensure_loaded()  # a lazy model (the default listing's) loads on its first request
            size = parse_size(req.size, replica.backend.native_size())
            t0 = time.perf_counter()
            image_request = ImageRequest(
                prompt=req.prompt,
                n=req.n,
                size=size,
                seed=req.seed,
                sampler=req.sampler,
                num_steps=req.num_inference_steps,
                cache_threshold=req.step_cache_threshold,
            )
            try:
                with replica.busy():
                    result = await replica.backend.generate_images(image_request)
            except BackendError as e:
                hooks.report_outcome(replica.name, BackendOutcome(False, time.perf_counter() - t0, e.kind))
                status = e.status if 400 <= e.status < 600 else 502
                raise APIError(status, str(e), code=e.kind, param=getattr(e, "param", None)) from None
            hooks.report_outcome(replica.name, BackendOutcome(True, time.perf_counter() - t0, None, 0, 0))
            image.update(
                {"size": f"{size[0]}x{size[1]}", "class_index": result.class_index, **result.plan, **result.stats}
            )
            greq.decide("image", image)
            pipeline.finish(rec, 200)
            pipeline.show_decisions(greq, rec)
            return {
                "created": int(time.time()),
                "data": [{"b64_json": base64.b64encode(p).decode()} for p in result.pngs],
                "output_format": "png",
                "size": image["size"],
                "tokenops": {"model": greq.model, "class": result.class_index, **result.plan, **result.stats},
            }
    finally:
        hooks.record(TelemetryEvent("image_requests", image_row(rec, image), ts=rec.arrival))


def image_row(rec: Any, image: dict[str, Any]) -> dict[str, Any]:
    """The ``image_requests`` telemetry row of one finished image request."""
    return {
        "id": rec.id,
        "ts": rec.arrival,
        "tenant": rec.tenant,
        "model": rec.model_served or rec.model_requested,
        "replica": rec.backend,
        "num_images": image.get("n"),
        "size": image.get("size"),
        "class_index": image.get("class_index"),
        "sampler": image.get("sampler"),
        "steps": image.get("steps"),
        "deep_steps": image.get("deep_steps"),
        "cache_threshold": image.get("cache_threshold"),
        "cache_reuse_ratio": image.get("cache_reuse_ratio"),
        "e2e_s": rec.e2e_s,
        "status": rec.outcome,
        "http_status": rec.status,
    }
