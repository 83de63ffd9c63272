"""The built-in backend kinds: ``local`` (bundled engine), ``openai`` (any OpenAI-compatible
server), ``embedding`` (an in-process sentence-embedding model for /v1/embeddings) and
``diffusion`` (a local diffusers pipeline folder for /v1/images/generations)."""

from tokenops import hookimpl

TOKENOPS_LAYER = "setup"


def _local(model, settings):
    from tokenops.backends.local import LocalBackend

    return LocalBackend(model, settings)


def _openai(model, settings):
    from tokenops.backends.openai_http import OpenAIBackend

    return OpenAIBackend(model, settings)


def _embedding(model, settings):
    from tokenops.backends.embedding import EmbeddingBackend

    return EmbeddingBackend(model, settings)


def _diffusion(model, settings):
    from tokenops.backends.diffusion import DiffusionBackend

    return DiffusionBackend(model, settings)


@hookimpl(trylast=True)
def tokenops_register_backends(register):
    register("local", _local)
    register("openai", _openai)
    register("diffusion", _diffusion)
    register("embedding", _embedding)
