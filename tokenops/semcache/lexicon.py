"""English closed-class words and request frames for the verifier's alignment.

Nothing here lists *meanings* (no antonym or synonym pairs): these are the closed
word classes of English grammar (articles, auxiliaries, pronouns, prepositions and
particles, negators, modals, question words) plus the discourse frames people wrap a
question in ("can you tell me", "I'd like to know", "what is the best way to").
The verifier drops fillers, turns tense and modality into marker tokens, and treats
every other word — open-class words, particles, prepositions, negators, numbers — as
content that must be matched in the other prompt. Open-class words are unbounded,
so a new antonym, entity or verb is a miss by construction, not by listing.
"""

from __future__ import annotations

import re

#: words that carry no meaning a cached answer depends on (articles, present-tense
#: auxiliaries, the asker's own pronouns, politeness, discourse glue)
FILLERS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "am",
        "be",
        "been",
        "being",
        "do",
        "does",
        "doing",
        "done",
        "have",
        "has",
        "having",
        "i",
        "me",
        "my",
        "mine",
        "myself",
        "we",
        "us",
        "our",
        "ours",
        "one",
        "someone",
        "somebody",
        "people",
        "this",
        "that",
        "these",
        "those",
        "it",
        "its",
        "there",
        "here",
        "please",
        "kindly",
        "just",
        "actually",
        "exactly",
        "really",
        "basically",
        "simply",
        "currently",
        "anyway",
        "thanks",
        "thank",
        "hey",
        "hi",
        "hello",
        "ok",
        "okay",
        "so",
        "well",
        "also",
        "again",
        "now",
        "possible",
        "possibly",
        "some",
        "any",
    ]
)

#: prepositions and particles: closed class, always content, matched only by themselves
#: ("turn on" vs "turn off", "with" vs "without", "from A to B")
PREPOSITIONS = frozenset(
    [
        "about",
        "above",
        "across",
        "after",
        "against",
        "along",
        "amid",
        "among",
        "around",
        "as",
        "at",
        "before",
        "behind",
        "below",
        "beneath",
        "beside",
        "besides",
        "between",
        "beyond",
        "by",
        "despite",
        "down",
        "during",
        "except",
        "for",
        "from",
        "in",
        "inside",
        "instead",
        "into",
        "like",
        "near",
        "of",
        "off",
        "on",
        "onto",
        "opposite",
        "out",
        "outside",
        "over",
        "past",
        "per",
        "plus",
        "minus",
        "since",
        "than",
        "through",
        "throughout",
        "till",
        "to",
        "toward",
        "towards",
        "under",
        "underneath",
        "unlike",
        "until",
        "up",
        "upon",
        "versus",
        "vs",
        "via",
        "with",
        "within",
        "without",
        "back",
        "away",
        "apart",
        "forward",
        "backward",
        "backwards",
        "ahead",
        "aside",
        "together",
    ]
)
#: prepositions that only mark a relation another form states without them ("capital of
#: France" / "France's capital", "a recipe for pancakes" / "a pancake recipe"): left over, they are
#: not a change; matched, they still order their operands
OPTIONAL_PARTICLES = frozenset({"of", "for"})

NEGATORS = {
    "not": "not",
    "no": "not",
    "never": "never",
    "none": "none",
    "nobody": "nobody",
    "nothing": "nothing",
    "neither": "neither",
    "nor": "nor",
    "nowhere": "nowhere",
    "cannot": "not",
}

#: modal verbs by the attitude they express; each class is one content token
MODALS = {
    "can": "MODAL_can",
    "could": "MODAL_can",
    "may": "MODAL_can",
    "might": "MODAL_may",
    "should": "MODAL_should",
    "ought": "MODAL_should",
    "must": "MODAL_must",
    "would": "MODAL_would",
    "shall": "TENSE_future",
    "will": "TENSE_future",
}
#: auxiliaries that mark tense (a change of tense changes the answer)
TENSE_AUX = {"did": "TENSE_past", "was": "TENSE_past", "were": "TENSE_past", "had": "TENSE_past"}
#: question words; "what" and "which" ask the same thing
QUESTION_WORDS = {
    "what": "what",
    "which": "what",
    "how": "how",
    "why": "why",
    "when": "when",
    "where": "where",
    "who": "who",
    "whom": "who",
    "whose": "whose",
}

NUMBER_WORDS = {
    w: float(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
NUMBER_WORDS.update(
    {
        "thirty": 30,
        "forty": 40,
        "fifty": 50,
        "sixty": 60,
        "seventy": 70,
        "eighty": 80,
        "ninety": 90,
        "hundred": 100,
        "thousand": 1000,
        "million": 1e6,
        "billion": 1e9,
        "dozen": 12,
        "half": 0.5,
        "twice": 2,
        "once": 1,
        "first": 1,
        "second": 2,
        "third": 3,
    }
)
# "one" is a pronoun far more often than a number in questions ("how does one...")
del NUMBER_WORDS["one"]

_CONTRACTIONS = [
    (r"\bcan['’]t\b", "can not"),
    (r"\bwon['’]t\b", "will not"),
    (r"\bshan['’]t\b", "shall not"),
    (r"\bain['’]t\b", "is not"),
    (r"n['’]t\b", " not"),
    (r"['’]ll\b", " will"),
    (r"['’]re\b", " are"),
    (r"['’]ve\b", " have"),
    (r"['’]m\b", " am"),
    (r"['’]d\b", " would"),
    (r"\b(what|it|that|there|here|who|how|where|when|why|which|this|he|she)['’]s\b", r"\1 is"),
    (r"['’]s\b", ""),
    (r"(?<=s)['’](?=\s|$)", ""),
]
_SYMBOLS = [
    (r"\s*(->|→|=>|⟶)\s*", " to "),
    (r"%", " percent "),
    (r"\$", " dollar "),
    (r"€", " euro "),
    (r"£", " pound "),
    (r"°\s*c\b", " celsius "),
    (r"°\s*f\b", " fahrenheit "),
    (r"\s&\s", " and "),
    (r"\s\+\s", " plus "),
    (r"\s-\s(?=\d)", " minus "),
    (r"(?<=\d)\s*x\s*(?=\d)", " times "),
]

_WH = r"(?= (how|why|what|when|where|who|which|whether|if)\b)"
#: request frames around the question itself, removed before tokens are read
_FRAMES = [
    r"^(hey|hi|hello)\b[\s,!.]*",
    r"\b(can|could|would|will) you (please |kindly )?(tell|show|explain to|give|teach|remind|let) (me|us)\b( know)?",
    r"\b(can|could|would|will) you (please |kindly )?(explain|describe|clarify|outline)\b" + _WH,
    r"\b(please )?(tell|show|explain to|give|teach|remind) (me|us)\b",
    r"\b(i|we) (would|want|wanna|need|wish|am trying)( like)? to (know|understand|learn|find out|figure out)\b",
    r"\b(i am|i'm) (curious|wondering)( about)?\b",
    r"\bi (was )?wonder(ing)?\b( if| whether)?",
    r"\bdo you (happen to )?know\b",
    r"\bany idea\b",
    r"\bi have a question\b:?",
    r"\bquick question\b:?",
    r"\bhelp me (to )?(understand )?",
    r"\b(could|can) you help\b",
    r"\bin simple terms\b",
    r"\bbriefly\b",
    r"^(please )?(explain|describe)\b" + _WH,
    # a request to the assistant ("can you recommend a book") is the imperative ("recommend a book")
    r"^(can|could|would) you (please |kindly )?(?=(recommend|suggest|write|list|give|summari[sz]e|translate|name|"
    r"find|make|create|generate|draft|compose|help)\b)",
]
#: question shapes with the same answer, rewritten to one form
_REWRITES = [
    (
        r"\bwhat (is|are) (the )?(best |easiest |right |proper |correct )?(way|ways|method|procedure|process|steps)"
        r" (to|for|of)\b",
        "how to",
    ),
    (r"\bwhat should (i|we|you|one) do to\b", "how to"),
    (
        r"\bhow (do|does|can|could|would|should|might|may|will|shall) (i|you|we|one|someone|people)\b"
        r"( be)?( able to| possible to| supposed to| going to)?",
        "how to",
    ),
    (r"\bhow to go about\b", "how to"),
    (r"\bin what way (can|do) (i|you|we)\b", "how to"),
    (r"\bwhat does (.+?) (mean|stand for)\b", r"what is \1"),
    (r"^define\b", "what is"),
    # "explain X" with no question word asks what X is
    (r"^((can|could|would|will) you )?(please )?(explain|describe|clarify|tell me about)\b", "what is"),
    (r"\bwhat (is|are) (the )?(meaning|definition) of\b", "what is"),
    (r"\b(the )?(meaning|definition) of\b", "what is"),
    (r"\bis it possible (for (me|us|you) )?to\b", "can i"),
    (r"\b(am i|are we|are you) (allowed|able|permitted) to\b", "can i"),
    (r"\bgoing to\b", "will"),
]
FRAMES = [re.compile(p) for p in _FRAMES]
REWRITES = [(re.compile(p), r) for p, r in _REWRITES]
CONTRACTIONS = [(re.compile(p), r) for p, r in _CONTRACTIONS]
SYMBOLS = [(re.compile(p), r) for p, r in _SYMBOLS]
