"""Refuse requests whose text contains a blocked word (layer 4: admission)."""

from tokenops import hookimpl
from tokenops.tunables import Tunable
from tokenops.types import Rejection

TOKENOPS_LAYER = "compute_network"
#: [plugins.blocklist] words = [...]: the only key; serve refuses a misspelt one (docs/plugins.md).
TOKENOPS_SETTINGS = {"blocklist": ("words",)}

_words: set[str] = {"forbidden"}


@hookimpl
def tokenops_register_tunables(register):
    register(Tunable("blocklist.words", "str", "forbidden", "Comma-separated words that get a request refused.", live=True))


@hookimpl
def tokenops_configure(settings):
    words = settings.plugin_settings("blocklist").get("words")
    if words:
        _words.clear()
        _words.update(w.strip().lower() for w in words if w.strip())


@hookimpl
def tokenops_admit(request):
    # what the user asks now: a word quoted from an earlier turn does not refuse every later one
    text = request.last_user_message().lower()
    hit = next((w for w in sorted(_words) if w in text), None)
    if hit is None:
        return None
    return Rejection(status=400, message=f"request refused: contains the blocked word {hit!r}", code="content_blocked")


@hookimpl
def tokenops_apply_tunables(values):
    if "blocklist.words" in values:
        _words.clear()
        _words.update(w.strip().lower() for w in values["blocklist.words"].split(",") if w.strip())
