"""Reject near-identical prompts that mean something else.

Embeddings place "How do I reset my password?" and "How do I not reset my
password?" closer than two honest paraphrases, so a semantic hit must also pass
cheap checks on what embeddings blur:

- negation: the two prompts must agree on negation (``not``, ``no``, ``never``,
  ``n't``, ``without``, ...), counted per prompt;
- numbers: the same numbers (digits, decimals, number words) in both;
- entities: the same capitalised names and acronyms (words capitalised anywhere
  but the start of a sentence), case-insensitively;
- opposites: one prompt must not use a word whose antonym the other uses instead
  (largest/smallest, before/after, increase/decrease, ...);
- swapped subject: when the prompts differ by swapping one or two content words
  for one or two others ("can dogs eat grapes" / "can cats eat grapes") the swap
  usually changes the subject; real paraphrases reword more, or only function words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NEGATIONS = frozenset("not no never none nobody nothing neither nor nowhere without cannot cant dont doesnt didnt "
                       "isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt mustnt neednt "
                       "except excluding".split())
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
                      "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "half": 0.5,
                      "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "once": 1, "twice": 2,
                      "double": 2, "triple": 3, "dozen": 12})
_OPPOSITES = [("largest", "smallest"), ("biggest", "smallest"), ("largest", "tiniest"), ("highest", "lowest"), ("max", "min"),
              ("maximum", "minimum"), ("increase", "decrease"), ("before", "after"), ("above", "below"),
              ("more", "less"), ("more", "fewer"), ("most", "least"), ("best", "worst"), ("hot", "cold"), ("up", "down"),
              ("add", "remove"), ("enable", "disable"), ("open", "close"), ("buy", "sell"), ("fast", "slow"),
              ("faster", "slower"), ("long", "short"), ("longer", "shorter"), ("true", "false"), ("start", "stop"),
              ("win", "lose"), ("north", "south"), ("east", "west"), ("import", "export"), ("encrypt", "decrypt"),
              ("compress", "decompress"), ("advantages", "disadvantages"), ("pros", "cons"),
              ("oldest", "newest"), ("oldest", "youngest"), ("early", "late"), ("earliest", "latest"),
              ("upload", "download"), ("inside", "outside"), ("input", "output"), ("male", "female"),
              ("left", "right"), ("sum", "product"), ("add", "subtract"), ("multiply", "divide"), ("rise", "fall"),
              ("love", "hate"), ("accept", "reject"), ("allow", "deny"), ("positive", "negative"), ("light", "dark"),
              ("heavier", "lighter"), ("easy", "hard"), ("easiest", "hardest"), ("synonym", "antonym"),
              ("ascending", "descending"), ("celsius", "fahrenheit"), ("lowercase", "uppercase")]
_OPPOSITE_OF: dict[str, set[str]] = {}
for _a, _b in _OPPOSITES:
    _OPPOSITE_OF.setdefault(_a, set()).add(_b)
    _OPPOSITE_OF.setdefault(_b, set()).add(_a)

_TOKEN = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?|\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.!?:\n]\s*$")
_STOPWORDS = frozenset("a an the of to in on at for from by with about into over under and or but if then so as "
                       "is are was were be been being am do does did done doing have has had having can could will "
                       "would shall should may might must i me my mine you your yours we our us he she it its they "
                       "them their this that these those there here what which who whom whose when where why how "
                       "please tell give show explain me some any all each every just also very really quite "
                       "what's how's it's i'm get way ways best way steps need want like know".split())
_NOT_NAMES = frozenset("i i'm i've i'd i'll ok please what how why who when where which can could would should "
                       "is are do does did hi hello hey tell give explain write list the a an".split())


@dataclass(slots=True, frozen=True)
class Signature:
    """What a prompt says that similarity scores blur."""

    num_negations: int
    numbers: frozenset
    entities: frozenset
    words: frozenset
    stems: frozenset


def _number(token: str) -> float | None:
    if token[0].isdigit():
        try:
            return float(token.replace(",", ""))
        except ValueError:
            return None
    return _NUMBER_WORDS.get(token.lower())


def signature(text: str) -> Signature:
    negations, numbers, entities, words, stems = 0, set(), set(), set(), set()
    for m in _TOKEN.finditer(text):
        token = m.group(0)
        low = token.lower().replace("’", "'")
        bare = low.replace("'", "")
        words.add(low)
        if bare in _NEGATIONS or low.endswith("n't"):
            negations += 1
        value = _number(token)
        if value is not None:
            numbers.add(value)
            continue
        if low not in _STOPWORDS and bare not in _NEGATIONS:
            stems.add(_stem(low))
        at_sentence_start = m.start() == 0 or bool(_SENTENCE_END.search(text[: m.start()]))
        is_acronym = len(token) >= 2 and token.isupper()
        if (token[0].isupper() and not at_sentence_start or is_acronym) and low not in _NOT_NAMES:
            entities.add(low[:-2] if low.endswith("'s") else low)
    return Signature(negations, frozenset(numbers), frozenset(entities), frozenset(words), frozenset(stems))


def _stem(word: str) -> str:
    """Crude suffix stripping so inflections and possessives are not swaps."""
    word = word.removesuffix("'s")
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def mismatch(a: str | Signature, b: str | Signature) -> str | None:
    """Why ``a`` and ``b`` may mean different things (``negation``, ``numbers``,
    ``entities``, ``opposites``), or None when nothing tells them apart."""
    sa = a if isinstance(a, Signature) else signature(a)
    sb = b if isinstance(b, Signature) else signature(b)
    if sa.num_negations != sb.num_negations:
        return "negation"
    if sa.numbers != sb.numbers:
        return "numbers"
    if sa.entities != sb.entities:
        return "entities"
    only_a, only_b = sa.words - sb.words, sb.words - sa.words
    for w in only_a:
        if _OPPOSITE_OF.get(w, set()) & only_b:
            return "opposites"
    swap_a, swap_b = sa.stems - sb.stems, sb.stems - sa.stems
    if swap_a and swap_b and len(swap_a) <= 2 and len(swap_b) <= 2 and sa.stems & sb.stems:
        return "swapped"
    return None
