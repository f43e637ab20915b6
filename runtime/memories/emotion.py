"""The emotion of a piece of conversation, from a small hand-written lexicon.

What this is, honestly: about 220 common English words, hand-picked for this
project (not derived from a published lexicon), each mapped to one of six
labels (:data:`LABELS`), plus a few emoticons and emoji. A text is tokenised,
each word is looked up (as written, then with a plural/past/gerund suffix
stripped), a hit preceded within three words by a negation ("not", "never",
"n't"...) is ignored, and one preceded by an intensifier ("so", "really",
"very"...) counts 1.5. Words that are mostly politeness in chat ("great",
"nice", "awesome"...) count half. The label with the most weight wins; ties
go to the order of :data:`LABELS`. No hit means ``"neutral"``.

It is a weak signal, good enough to tag an episode as happy, sad, angry,
anxious, surprised or loving when the words say so plainly. It understands no
sarcasm, no idiom and no language other than English; with a language model
configured the model names the emotion instead (``runtime/mind/distil.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LABELS = ("joy", "sadness", "anger", "fear", "surprise", "love")
NEUTRAL = "neutral"

_WORDS: dict[str, tuple[str, ...]] = {
    "joy": (
        "happy", "glad", "joy", "joyful", "delighted", "excited", "exciting", "thrilled",
        "great", "awesome", "amazing", "wonderful", "fantastic", "fun", "enjoy", "enjoyed",
        "yay", "celebrate", "celebrated", "celebration", "proud", "pride", "cheerful",
        "grateful", "thankful", "blessed", "relieved", "relief", "pleased", "satisfied",
        "brilliant", "lovely", "beautiful", "nice", "excellent", "win", "won", "success",
        "successful", "accomplished", "achievement", "hooray", "laugh", "laughed",
        "smile", "smiled", "peaceful", "hopeful", "optimistic", "inspired",
        "inspiring", "uplifting", "empowering", "empowered", "fulfilling", "rewarding",
    ),
    "sadness": (
        "sad", "unhappy", "depressed", "depressing", "miserable", "lonely",
        "alone", "cry", "cried", "crying", "tears", "grief", "grieving", "mourn",
        "mourning", "loss", "lost", "miss", "missed", "missing", "heartbroken",
        "disappointed", "disappointing", "disappointment", "sorry", "regret", "hurt",
        "hurting", "pain", "painful", "tough", "struggle", "struggled",
        "struggling", "died", "death", "funeral", "gloomy", "hopeless",
        "tired", "exhausted", "broke", "breakup", "divorce", "sick", "ill",
    ),
    "anger": (
        "angry", "mad", "furious", "annoyed", "annoying", "irritated", "irritating",
        "frustrated", "frustrating", "frustration", "hate", "hated", "rage", "outraged",
        "outrageous", "unfair", "resent", "resentful", "pissed", "disgusted",
        "disgusting", "ridiculous", "argue", "argued", "argument", "fight", "fought",
        "yelled", "shouted", "betrayed", "offended", "bitter", "hostile",
    ),
    "fear": (
        "afraid", "scared", "frightened", "fear", "terrified", "terrifying", "anxious",
        "anxiety", "worried", "worry", "worrying", "nervous", "panic", "panicked",
        "stress", "stressed", "stressful", "overwhelmed", "dread", "uneasy", "unsafe",
        "danger", "dangerous", "risky", "threat", "threatened", "insecure", "uncertain",
        "unsure", "doubt", "doubts", "concerned", "concern", "tense",
    ),
    "surprise": (
        "surprised", "surprise", "surprising", "shocked", "shocking", "wow", "whoa",
        "unexpected", "unexpectedly", "suddenly", "astonished", "amazed", "unbelievable",
        "incredible", "omg", "stunned", "speechless",
    ),
    "love": (
        "love", "loved", "loving", "adore", "adored", "care", "caring", "cherish",
        "cherished", "dear", "darling", "sweetheart", "hug", "hugs", "hugged", "kiss",
        "kissed", "affection", "affectionate", "romantic", "support", "supportive",
        "supported", "bond", "friendship", "kindness", "warm", "warmth", "accepted",
        "acceptance", "belong", "belonging",
    ),
}

_SYMBOLS: dict[str, str] = {
    ":)": "joy", ":-)": "joy", ":d": "joy", "😊": "joy", "😀": "joy", "😄": "joy",
    "🎉": "joy", "😂": "joy", ":(": "sadness", ":-(": "sadness", "😢": "sadness",
    "😭": "sadness", "😠": "anger", "😡": "anger", "😱": "fear", "😨": "fear",
    "😮": "surprise", "😲": "surprise", "❤": "love", "❤️": "love", "😍": "love",
    "🥰": "love",
}

_LEXICON: dict[str, str] = {w: label for label, words in _WORDS.items() for w in words}

# Mostly politeness in conversation: half weight.
WEAK = frozenset({"great", "nice", "awesome", "amazing", "cool", "fun", "lovely", "beautiful",
                  "wonderful", "fantastic", "excellent", "brilliant", "sorry", "care", "dear",
                  "support", "wow"})

NEGATIONS = frozenset({"not", "no", "never", "nothing", "hardly", "without", "nor",
                       "isn't", "wasn't", "don't", "didn't", "doesn't", "can't", "couldn't",
                       "won't", "wouldn't", "aren't", "weren't", "haven't", "hasn't", "n't"})
INTENSIFIERS = frozenset({"so", "very", "really", "extremely", "super", "totally",
                          "incredibly", "absolutely", "truly", "deeply", "such"})
_NEGATION_WINDOW = 3

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|:-?[()d]|[\u2600-\u27bf\U0001F300-\U0001FAFF]\ufe0f?")


def _lookup(word: str) -> str | None:
    label = _LEXICON.get(word)
    if label is not None:
        return label
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            label = _LEXICON.get(stem) or _LEXICON.get(stem + "e")
            if label is not None:
                return label
    return None


@dataclass(frozen=True)
class EmotionReading:
    label: str          # one of LABELS, or NEUTRAL
    weight: float       # the winning label's weight (0 when neutral)
    hits: int           # lexicon hits of any label, negated ones excluded


def read_emotion(text: str) -> EmotionReading:
    """The dominant emotion of ``text`` by the lexicon (see the module docstring)."""
    tokens = _TOKEN.findall(text.lower())
    scores = dict.fromkeys(LABELS, 0.0)
    hits = 0
    for i, token in enumerate(tokens):
        label = _SYMBOLS.get(token) or _lookup(token)
        if label is None:
            continue
        before = tokens[max(0, i - _NEGATION_WINDOW):i]
        if any(t in NEGATIONS or t.endswith("n't") for t in before):
            continue
        weight = 1.5 if i > 0 and tokens[i - 1] in INTENSIFIERS else 1.0
        if token in WEAK:
            weight /= 2
        scores[label] += weight
        hits += 1
    best = max(LABELS, key=lambda lab: (scores[lab], -LABELS.index(lab)))
    if scores[best] <= 0.0:
        return EmotionReading(NEUTRAL, 0.0, 0)
    return EmotionReading(best, scores[best], hits)
