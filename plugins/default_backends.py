"""The built-in backend kinds: ``local`` (bundled engine), ``openai`` (any OpenAI-compatible
server) and ``embedding`` (an in-process sentence-embedding model for /v1/embeddings)."""

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


@hookimpl(trylast=True)
def tokenops_register_backends(register):
    register("local", _local)
    register("openai", _openai)
    register("embedding", _embedding)
