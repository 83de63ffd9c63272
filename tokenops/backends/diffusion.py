"""The ``diffusion`` backend: a local diffusers UNet pipeline folder, in-process.

Configured as ``[[models]] backend = "diffusion"`` with ``path`` = the folder (see
:mod:`tokenops.diffusion.model`). It serves ``POST /v1/images/generations``
(:mod:`tokenops.gateway.openai.images`); chat and completion requests get a 400 saying so.
Each request's sampler, step count and step-cache policy come from the
``tokenops_diffusion_plan`` plugins, then from the request's own extension fields.
Generations run one at a time per replica, on a worker thread.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tokenops.backends.base import LoadOnce, pop_load_mode, replica_name
from tokenops.backends.plugin_calls import PluginCalls, builtin_calls
from tokenops.config import ConfigError, ModelConfig, Settings
from tokenops.types import BackendError, GatewayRequest, GatewayResponse


@dataclass(slots=True)
class ImageRequest:
    """One validated ``/v1/images/generations`` request as the backend runs it."""

    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None  # (width, height); None = the model's native size
    seed: int | None = None
    sampler: str | None = None  # request overrides of the plugins' plan
    num_steps: int | None = None
    cache_threshold: float | None = None


@dataclass(slots=True)
class ImageResult:
    pngs: list[bytes]
    size: tuple[int, int]
    class_index: int
    plan: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)


class DiffusionBackend:
    """One in-process diffusion pipeline serving one model."""

    kind = "diffusion"
    max_model_len: int | None = None

    def __init__(
        self, model: ModelConfig, settings: Settings, pipeline: Any = None, *, calls: PluginCalls | None = None
    ) -> None:
        #: what this backend asks the plugins (the plan hook); built-ins when none is given
        self.calls = calls if calls is not None else builtin_calls()
        if model.path is None and pipeline is None:
            raise ConfigError(f"model {model.name!r}: backend 'diffusion' needs path = a diffusers pipeline folder")
        self.model = model.name
        self.name = replica_name(model)
        self.path = model.path
        options = dict(model.engine)
        # [[models]] engine = {torch_threads = N}, else [engine] torch_threads: small images gain nothing from
        # more threads, and on a busy CPU extra threads spin at every op's barrier
        self.torch_threads = options.pop("torch_threads", settings.engine.torch_threads)
        # load = "lazy": the pipeline (and diffusers, ~2 s to import) loads on the first image request, not at start
        is_lazy = pop_load_mode(model, options, "diffusion", "torch_threads")
        #: a tokenops.diffusion.model.DiffusionModel once loaded
        self._pipeline = LoadOnce(model, self.name, is_lazy, pipeline)
        self._slot = asyncio.Semaphore(1)
        self._lock = threading.Lock()
        self.num_running = 0
        self.num_waiting = 0
        self.num_requests = 0
        self.num_images = 0
        self.num_steps = 0
        self.num_deep_steps = 0
        self.last_e2e_s: float | None = None

    @property
    def pipeline(self) -> Any:
        return self._pipeline.value

    @property
    def ready(self) -> bool:
        return self._pipeline.ready

    async def start(self) -> None:
        if self.torch_threads:
            import torch

            torch.set_num_threads(int(self.torch_threads))
        if not self._pipeline.is_lazy:
            await self.ensure_loaded()

    async def ensure_loaded(self) -> Any:
        """The pipeline, loaded now if this is a lazy model's first request (one load however many wait)."""

        def load() -> Any:
            from tokenops.diffusion.model import DiffusionModel

            assert self.path is not None  # __init__ refuses a model with neither a path nor a pipeline
            return DiffusionModel.load(self.path)

        return await self._pipeline.get(load)

    async def close(self) -> None:
        self._pipeline.value = None

    # -- text endpoints: not this kind's job --------------------------------

    def _not_text(self) -> BackendError:
        return BackendError(
            f"`{self.model}` is an image model: use POST /v1/images/generations",
            kind="bad_request",
            status=400,
            backend=self.name,
        )

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        raise self._not_text()

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        raise self._not_text()

    async def stream(self, request: GatewayRequest) -> AsyncIterator[Any]:
        raise self._not_text()
        yield  # pragma: no cover - makes this an async generator

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        return {}  # the diffusion.* tunables belong to plugins, which read them per request

    def stats(self) -> dict[str, Any] | None:
        with self._lock:
            return {
                "model": self.model,
                "kind": self.kind,
                "num_running": self.num_running,
                "num_waiting": self.num_waiting,
                "images_total": self.num_images,
                "image_requests_total": self.num_requests,
                "diffusion_steps_total": self.num_steps,
                "cache_reuse_ratio": (1 - self.num_deep_steps / self.num_steps) if self.num_steps else None,
            }

    # -- images --------------------------------------------------------------

    def native_size(self) -> tuple[int, int]:
        if self.pipeline is None:
            raise BackendError(f"`{self.model}` is still loading", kind="unavailable", status=503, backend=self.name)
        height, width = self.pipeline.image_size
        return width, height

    def class_for(self, prompt: str) -> int:
        from tokenops.diffusion.model import PromptError

        try:
            return self.pipeline.prompts.class_for(prompt)
        except PromptError as e:
            error = BackendError(str(e), kind="bad_request", status=400, backend=self.name)
            error.param = "prompt"  # type: ignore[attr-defined]
            raise error from None

    def plan_for(self, request: ImageRequest) -> Any:
        """Defaults of the folder, then plugins, then the request's overrides."""
        import dataclasses

        from tokenops.diffusion.samplers import SAMPLERS, SamplerError, check_steps

        plan = self.calls.diffusion_plan(self.model, self.pipeline.default_sampler, self.pipeline.default_steps)
        if request.sampler is not None:
            plan.sampler = request.sampler
        if request.num_steps is not None:
            plan.num_steps = request.num_steps
        if request.cache_threshold is not None:
            plan.cache = dataclasses.replace(plan.cache, threshold=request.cache_threshold)
        try:
            if plan.sampler not in SAMPLERS:
                raise SamplerError(f"unknown sampler {plan.sampler!r}; one of: {', '.join(SAMPLERS)}")
            check_steps(plan.num_steps, self.pipeline.num_train_timesteps, plan.sampler)
        except SamplerError as e:
            error = BackendError(str(e), kind="bad_request", status=400, backend=self.name)
            error.param = "num_inference_steps" if request.num_steps is not None else None  # type: ignore[attr-defined]
            raise error from None
        return plan

    async def generate_images(self, request: ImageRequest) -> ImageResult:
        if self.pipeline is None:
            raise BackendError(f"`{self.model}` is still loading", kind="unavailable", status=503, backend=self.name)
        class_index = self.class_for(request.prompt)
        plan = self.plan_for(request)
        with self._lock:
            self.num_waiting += 1
        try:
            await self._slot.acquire()
        finally:
            with self._lock:
                self.num_waiting -= 1
        with self._lock:
            self.num_running += 1

        def done(_: Any) -> None:
            with self._lock:
                self.num_running -= 1
            self._slot.release()

        # the slot is held until the computation ends, not until the client leaves: a client
        # that gave up must not let the next request run beside a generation still going
        work = asyncio.ensure_future(asyncio.to_thread(self._generate, class_index, request, plan))
        work.add_done_callback(done)
        images, stats = await asyncio.shield(work)
        size = request.size or self.native_size()
        pngs = await asyncio.to_thread(encode_pngs, images, size)
        with self._lock:
            self.num_requests += 1
            self.num_images += len(pngs)
            self.num_steps += stats.num_steps
            self.num_deep_steps += stats.num_deep
        return ImageResult(pngs=pngs, size=size, class_index=class_index, plan=plan.to_dict(), stats=stats.to_dict())

    def _generate(self, class_index: int, request: ImageRequest, plan: Any) -> Any:
        import torch

        labels = torch.full((request.n,), class_index, dtype=torch.long)
        return self.pipeline.generate(
            labels, sampler=plan.sampler, num_steps=plan.num_steps, seed=request.seed, policy=plan.cache
        )


def encode_pngs(images: Any, size: tuple[int, int]) -> list[bytes]:
    """PNG bytes of each image (``(N, C, H, W)`` in [-1, 1]), scaled to ``size`` (width, height)
    with nearest-neighbour so the pixels stay crisp."""
    import torch
    from PIL import Image

    pixels = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(dtype=torch.uint8)
    out = []
    for img in pixels:
        array = img.permute(1, 2, 0).numpy()
        pil = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)  # uint8: L or RGB
        if pil.size != size:
            pil = pil.resize(size, Image.Resampling.NEAREST)
        buf = io.BytesIO()
        pil.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out
