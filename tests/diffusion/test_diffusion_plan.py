"""Samplers by name, prompt -> class, and the plugins' plan (tunables, config, request overrides)."""

import pytest

from tokenops.diffusion.model import PromptError, PromptLabels
from tokenops.diffusion.samplers import SAMPLERS, SamplerError, check_steps, make_scheduler


def test_each_sampler_walks_the_schedule_in_the_asked_steps():
    from diffusers import DDPMScheduler

    config = DDPMScheduler(num_train_timesteps=200, beta_schedule="squaredcos_cap_v2").config
    for name in SAMPLERS:
        scheduler = make_scheduler(name, config)
        scheduler.set_timesteps(10)
        assert len(scheduler.timesteps) == 10, name
        assert int(scheduler.timesteps.max()) < 200
    with pytest.raises(SamplerError, match="unknown sampler 'euler'"):
        make_scheduler("euler", config)


def test_check_steps_bounds():
    assert check_steps(200, 200) == 200
    for bad in (0, 201, True, 2.5):
        with pytest.raises(SamplerError, match=r"\[1, 200\]"):
            check_steps(bad, 200)


@pytest.mark.parametrize("prompt,expected", [("7", 7), ("draw a 7", 7), ("Seven, please", 7), ("a 3 then a 5", 3),
                                             ("zero", 0), ("digit 9!", 9)])
def test_prompt_names_a_class(prompt, expected):
    labels = PromptLabels([str(i) for i in range(10)], {"zero": 0, "seven": 7})
    assert labels.class_for(prompt) == expected


@pytest.mark.parametrize("prompt", ["a cat", "17", "sevens"])
def test_prompt_without_a_class_is_refused(prompt):
    labels = PromptLabels([str(i) for i in range(10)], {"seven": 7})
    with pytest.raises(PromptError, match="name one of: 0, 1"):
        labels.class_for(prompt)


@pytest.fixture
def plugin_conf():
    from tokenops.plugin_manager import get_plugin

    # the process's instances (hook() reaches them outside a gateway)
    diffusion_sampler, step_cache = get_plugin("diffusion_sampler"), get_plugin("step_cache")
    saved = dict(diffusion_sampler.conf), dict(step_cache.conf)
    yield diffusion_sampler, step_cache
    diffusion_sampler.conf.update(saved[0])
    step_cache.conf.update(saved[1])


def test_plugins_set_the_plan_and_follow_live_tunables(plugin_conf):
    from tokenops.diffusion.plan import get_plan
    from tokenops.plugin_manager import get_tunables, hook

    registry = get_tunables()
    for name in ("diffusion.sampler", "diffusion.steps", "diffusion.cache_threshold", "diffusion.cache_max_reuse"):
        assert registry[name].live, name
    defaults = get_plan("digits", "ddpm", 200)
    assert (defaults.sampler, defaults.num_steps) == (registry["diffusion.sampler"].default,
                                                      registry["diffusion.steps"].default)
    hook().tokenops_apply_tunables(values={"diffusion.sampler": "ddim", "diffusion.steps": 25,
                                           "diffusion.cache_threshold": 0.4, "diffusion.cache_max_reuse": 3})
    plan = get_plan("digits", "ddpm", 200)
    assert (plan.sampler, plan.num_steps, plan.cache.threshold, plan.cache.max_reuse) == ("ddim", 25, 0.4, 3)
    hook().tokenops_apply_tunables(values={"diffusion.sampler": "default", "diffusion.steps": 0})
    plan = get_plan("digits", "ddpm", 200)
    assert (plan.sampler, plan.num_steps) == ("ddpm", 200)  # the folder's own


def test_plugin_config_is_validated(plugin_conf):
    diffusion_sampler, step_cache = plugin_conf

    class Settings:
        def __init__(self, conf):
            self.conf = conf

        def plugin_settings(self, name):
            return self.conf.get(name, {})

    with pytest.raises(ValueError, match="sampler must be one of"):
        diffusion_sampler.tokenops_configure(Settings({"diffusion_sampler": {"sampler": "euler"}}))
    with pytest.raises(ValueError, match="threshold must be a number"):
        step_cache.tokenops_configure(Settings({"step_cache": {"threshold": -1}}))
    step_cache.tokenops_configure(Settings({"step_cache": {"threshold": 0.25, "warmup_steps": 2}}))
    assert step_cache.conf["threshold"] == 0.25 and step_cache.conf["warmup_steps"] == 2
