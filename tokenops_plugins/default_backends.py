"""The built-in backend kinds: ``local`` (bundled engine), ``openai`` (any OpenAI-compatible
server), ``embedding`` (an in-process sentence-embedding model for /v1/embeddings) and
``diffusion`` (a local diffusers pipeline folder for /v1/images/generations). The bundled ones
are built with what they ask the plugins (engine policies, thinking budgets, diffusion plans:
:func:`tokenops.policy_hooks.plugin_calls`)."""

from tokenops import hookimpl

TOKENOPS_LAYER = "setup"


def _local(model, settings):
    from tokenops.backends.local import LocalBackend
    from tokenops.policy_hooks import plugin_calls

    return LocalBackend(model, settings, calls=plugin_calls())


def _openai(model, settings):
    from tokenops.backends.openai_http import OpenAIBackend

    return OpenAIBackend(model, settings)


def _embedding(model, settings):
    from tokenops.backends.embedding import EmbeddingBackend

    return EmbeddingBackend(model, settings)


def _diffusion(model, settings):
    from tokenops.backends.diffusion import DiffusionBackend
    from tokenops.policy_hooks import plugin_calls

    return DiffusionBackend(model, settings, calls=plugin_calls())


@hookimpl(trylast=True)
def tokenops_register_backends(register):
    register("local", _local)
    register("openai", _openai)
    register("diffusion", _diffusion)
    register("embedding", _embedding)
