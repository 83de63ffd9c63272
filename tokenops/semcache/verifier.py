"""Judge whether two near-identical prompts ask the same thing, by aligning their content.

Embeddings place "turn on the light in the kitchen" and "turn off the light in the
kitchen" closer (0.86) than many honest paraphrases, so a semantic hit must also pass
an alignment of the two prompts' *content tokens*:

1. Both prompts are normalised (contractions, arrows, symbols), request frames are
   removed ("can you tell me", "I'd like to know") and equivalent question shapes are
   rewritten to one ("what is the best way to" -> "how to"); see :mod:`lexicon`.
2. What is left is split into tokens; closed-class fillers (articles, present-tense
   auxiliaries, the asker's pronouns) are dropped. Every other token is content:
   open-class words, numbers, negators, prepositions and particles, modals, tense
   markers (``did``, ``was``, ``will``) and question words.
3. Every content token of one prompt must be matched in the other by the same lemma
   (plural and ``-ing`` folded; ``-ed``, ``-er``, ``-est`` kept, since tense and
   degree change the answer). Open-class words left over may be matched by a true
   synonym: cosine of the two words' embeddings at or above ``synonym_threshold``,
   one-to-one, and never between a word and its own derivation ("encrypt"/"decrypt",
   "larger"/"largest", "safe"/"unsafe") nor between names or numbers. Anything left
   unmatched is a miss — a new antonym, particle, entity or unit needs no list entry.
4. Operand order: two matched tokens that a matched token (a preposition or a verb)
   separates in both prompts must keep their order ("euros to dollars" vs "dollars to
   euros", "a lion beat a tiger" vs "a tiger beat a lion").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tokenops.semcache import lexicon as lx


class SimilarityMatrix(Protocol):
    """Rows of cosines, read as ``matrix[x][y]``: a list of lists or a NumPy array."""

    def __getitem__(self, row: int, /) -> Any: ...


#: ``similarity(words_a, words_b) -> matrix`` of cosines between open-class words
WordSimilarity = Callable[[Sequence[str], Sequence[str]], SimilarityMatrix]

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*(?:st|nd|rd|th)?|[^\W\d_]+(?:['’][^\W\d_]+)?", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?:;\n]\s*$")
#: affixes shared by two different words mean one derives from the other
_MIN_SHARED_AFFIX = 4


@dataclass(slots=True, frozen=True)
class Token:
    key: str  # lemma, number value, or a class marker such as ``TENSE_past``
    kind: str  # word | name | number | negation | particle | modal | tense | question | closed
    text: str  # the surface word, for synonym look-ups and explanations


@dataclass(slots=True, frozen=True)
class Signature:
    """A prompt's content tokens, in order."""

    tokens: tuple[Token, ...]

    @property
    def keys(self) -> list[str]:
        return [t.key for t in self.tokens]


#: closed-class content that is matched only by itself
_CLOSED = frozenset(
    [
        "and",
        "or",
        "but",
        "if",
        "because",
        "unless",
        "although",
        "though",
        "while",
        "whether",
        "either",
        "both",
        "all",
        "every",
        "each",
        "most",
        "more",
        "less",
        "least",
        "fewer",
        "many",
        "much",
        "few",
        "several",
        "only",
        "even",
        "still",
        "already",
        "yet",
        "too",
        "very",
        "enough",
        "same",
        "different",
        "other",
        "another",
        "else",
    ]
)


def normalise(text: str) -> str:
    """Lower-case text with contractions expanded, symbols spelled out and frames removed."""
    s = " " + text.strip() + " "
    for pattern, repl in lx.SYMBOLS:
        s = pattern.sub(repl, s)
    s = s.lower()
    for pattern, repl in lx.CONTRACTIONS:
        s = pattern.sub(repl, s)
    s = re.sub(r"[\s,]+", " ", s).strip()
    s = re.sub(r"[?.!]+$", "", s).strip()
    for pattern in lx.FRAMES:
        s = pattern.sub(" ", s).strip()
    for pattern, repl in lx.REWRITES:
        s = pattern.sub(repl, s)
    return re.sub(r"\s+", " ", s).strip()


def lemma(word: str) -> str:
    """Fold plural, third person and ``-ing``; keep affixes that change meaning."""
    w = word
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 4 and w.endswith(("sses", "ches", "shes", "xes", "zes")):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is", "ous")):
        w = w[:-1]
    elif len(w) > 5 and w.endswith("ing"):
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "aeiouls":
            w = w[:-1]
    return w.removesuffix("e") if len(w) > 3 else w


def _number(token: str) -> float | None:
    if token[0].isdigit():
        try:
            return float(re.sub(r"(st|nd|rd|th)$", "", token).replace(",", ""))
        except ValueError:
            return None
    return lx.NUMBER_WORDS.get(token)


def _names(text: str) -> set[str]:
    """Words written as names (capitalised inside a sentence, or acronyms)."""
    out = set()
    for m in _TOKEN.finditer(text):
        word = m.group(0)
        at_start = m.start() == 0 or bool(_SENTENCE_END.search(text[: m.start()]))
        if (word[0].isupper() and not at_start) or (len(word) >= 2 and word.isupper()):
            out.add(word.lower().replace("’", "'").removesuffix("'s"))
    return out


def signature(text: str) -> Signature:
    names = _names(text)
    words = _TOKEN.findall(normalise(text))
    tokens: list[Token] = []
    for i, w in enumerate(words):
        w = w.replace("’", "'")
        if (
            w == "you"
            and i > 0
            and words[i - 1] in ("do", "does", "did", "can", "could", "would", "will", "should", "are", "were", "have")
        ):
            continue  # "how do you...", the generic subject, is "how do I..."
        if w == "to" and i > 0 and words[i - 1] == "how":
            continue  # "how to" is one question word
        value = _number(w)
        if value is not None:
            tokens.append(Token(f"{value:g}", "number", w))
        elif w in lx.NEGATORS:
            tokens.append(Token(lx.NEGATORS[w], "negation", w))
        elif w in lx.TENSE_AUX:
            tokens.append(Token(lx.TENSE_AUX[w], "tense", w))
        elif w in lx.MODALS:
            tokens.append(Token(lx.MODALS[w], "tense" if w in ("will", "shall") else "modal", w))
        elif w in lx.QUESTION_WORDS:
            tokens.append(Token(lx.QUESTION_WORDS[w], "question", w))
        elif w in lx.PREPOSITIONS:
            tokens.append(Token(w if w != "vs" else "versus", "particle", w))
        elif w in lx.FILLERS:
            continue
        elif w in _CLOSED:
            tokens.append(Token(w, "closed", w))
        else:
            tokens.append(Token(lemma(w), "name" if w in names else "word", w))
    return Signature(tuple(tokens))


def _derived(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` share a stem or an ending: one derives from the other."""
    if a in b or b in a:
        return True
    n = _MIN_SHARED_AFFIX
    return len(a) >= n and len(b) >= n and (a[:n] == b[:n] or a[-n:] == b[-n:])


_REASONS = {
    "negation": "negation",
    "number": "numbers",
    "particle": "particle",
    "modal": "modal",
    "tense": "tense",
    "question": "question",
    "closed": "unmatched",
    "name": "entities",
    "word": "unmatched",
}


class Verifier:
    """Content-token alignment; ``word_similarity`` (optional) supplies synonyms."""

    def __init__(
        self,
        word_similarity: WordSimilarity | None = None,
        synonym_threshold: float = 0.65,
        max_synonyms: int = 3,
        min_content_tokens: int = 2,
    ) -> None:
        self.word_similarity = word_similarity
        self.min_content_tokens = min_content_tokens
        self.synonym_threshold = synonym_threshold
        self.max_synonyms = max_synonyms

    def mismatch(self, a: str | Signature, b: str | Signature) -> str | None:
        """Why ``a`` and ``b`` may ask different things, or None when they align."""
        sa = a if isinstance(a, Signature) else signature(a)
        sb = b if isinstance(b, Signature) else signature(b)
        ta, tb = sa.tokens, sb.tokens
        if min(len(ta), len(tb)) < self.min_content_tokens:
            return "too_short"  # "hi", "thanks", "how are you": too little to align, exact repeats only
        pairs: list[tuple[int, int]] = []
        free_b = list(range(len(tb)))
        rest_a: list[int] = []
        for i, tok in enumerate(ta):
            j = next((j for j in free_b if tb[j].key == tok.key), None)
            if j is None:
                rest_a.append(i)
            else:
                free_b.remove(j)
                pairs.append((i, j))
        rest_a = [i for i in rest_a if ta[i].key not in lx.OPTIONAL_PARTICLES]
        free_b = [j for j in free_b if tb[j].key not in lx.OPTIONAL_PARTICLES]
        for idx, toks in ((rest_a, ta), (free_b, tb)):
            closed = [toks[i] for i in idx if toks[i].kind != "word"]
            if closed:
                return _REASONS[closed[0].kind]
        if rest_a or free_b:
            synonyms = self._synonyms([ta[i] for i in rest_a], [tb[j] for j in free_b])
            if synonyms is None:
                return "unmatched"
            pairs += [(rest_a[x], free_b[y]) for x, y in synonyms]
        return "order" if _swapped(ta, tb, pairs) else None

    def _synonyms(self, wa: list[Token], wb: list[Token]) -> list[tuple[int, int]] | None:
        """A one-to-one pairing of the leftover words by synonymy, or None."""
        if self.word_similarity is None or len(wa) != len(wb) or len(wa) > self.max_synonyms:
            return None
        sims = self.word_similarity([t.text for t in wa], [t.text for t in wb])
        candidates = sorted(
            (
                (float(sims[x][y]), x, y)
                for x in range(len(wa))
                for y in range(len(wb))
                if not _derived(wa[x].key, wb[y].key)
            ),
            reverse=True,
        )
        used_a: set[int] = set()
        used_b: set[int] = set()
        out = []
        for sim, x, y in candidates:
            if sim < self.synonym_threshold:
                break
            if x not in used_a and y not in used_b:
                used_a.add(x)
                used_b.add(y)
                out.append((x, y))
        return out if len(out) == len(wa) else None


def _swapped(ta: tuple[Token, ...], tb: tuple[Token, ...], pairs: list[tuple[int, int]]) -> bool:
    """Two operands changed sides of a pivot that sits between them in both prompts.

    The pivot is any matched token: a preposition ("euros *to* dollars" / "dollars *to*
    euros") or a verb ("can a lion *beat* a tiger" / "can a tiger *beat* a lion"). Moves
    that keep meaning do not swap sides of a shared pivot: a particle after its object
    ("turn the light on"), a fronted phrase ("on Windows, how do I..."), a genitive
    ("France's capital"), or two phrases trading places ("to London from Paris").
    """
    operands = sorted((i, j) for i, j in pairs if ta[i].kind != "particle")
    pivots = sorted(pairs)
    for x, (i1, j1) in enumerate(operands):
        for i2, j2 in operands[x + 1 :]:
            if j1 < j2:
                continue
            if any(i1 < mi < i2 and j2 < mj < j1 for mi, mj in pivots):
                return True
    return False


_PLAIN = Verifier()


def mismatch(a: str | Signature, b: str | Signature) -> str | None:
    """The alignment without synonyms (``negation``, ``numbers``, ``particle``, ``order``, ...)."""
    return _PLAIN.mismatch(a, b)
