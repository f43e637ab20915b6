"""Offline fact extraction: deterministic rules for the common shapes.

This is the built-in extractor used with no language model. It reads one turn
at a time, knowing who said it ("I" and "we" are the turn's speaker), and
answers :class:`Candidate` facts. Every candidate names the rule that produced
it (:attr:`Candidate.rule`; the job puts it in the fact's provenance as
``rule:<name>``). It is honest rather than clever: it only matches the shapes
below, in first-person statements, and misses everything else.

What it covers (rule names in brackets):

- **relations** [``relation``]: "my sister Ana", "my best friend, Ana", "Ana
  is my sister", "my husband's name is Tom". Single-valued relations
  (husband, wife, partner, boyfriend, girlfriend, fiancé(e), mother, father,
  boss) are ``<speaker> <relation>: <Name>``, so a new husband supersedes the
  old one; the others (sister, friend, son...) are ``<Name> relation to
  <speaker>: <relation>``, so several sisters can coexist.
- **places** [``lives_in``, ``moved_to``, ``grew_up_in``, ``is_from``,
  ``visited``]: "I live in / we moved to <Place>" share the key ``lives_in``
  (a move supersedes the old home); "I grew up in", "I'm from"; "I/we
  visited / went to / travelled to <Place>" (one fact per place). A place is
  a run of capitalised words; "went to the gym" is not a place.
- **preferences** [``preference``, ``allergy``, ``favourite``]: "I love /
  like / enjoy / adore / hate / dislike / prefer <thing>" (key by the thing,
  so "I hate X" supersedes "I love X"), "I'm allergic to <thing>", "my
  favourite <category> is <thing>".
- **jobs** [``works_as``, ``occupation``, ``works_at``]: "I work as a <job>",
  "I'm a <job>" for jobs in a fixed list (nurse, teacher, engineer...), "I
  work at / for <Organisation>" (capitalised).
- **pets** [``pet``]: "my/our dog Max", "our cat named Luna", "we adopted a
  puppy called Rex", "my dog's name is Max".
- **dates and plans** [``birthday``, ``plan``]: "my birthday is <date>"; "I'm
  / we're going to / visiting / moving to / getting / starting <thing>
  <when>" and "<when>, we're going to <thing>", where <when> is "on <date>",
  "next week/month/year/...", "this weekend/...", "tomorrow", "in <Month>".
  The time is kept as said ("next month"), never resolved to a date: a
  resolved date would not appear word for word in the turn.
- **events** [``event``]: "I/we went to / attended / visited a|an|the
  <thing>", "I took my kids to a <thing>", "we went camping", with a past
  time said nearby ("yesterday", "last Friday", "two weekends ago") kept in
  the value. One key per thing (``event_pride_parade``): a later outing to
  the same thing supersedes the earlier one (history kept).

Objects ("<thing>") are a few words cut at the clause boundary (punctuation,
"and", "because", a time word; a preposition unless the object is a verb
phrase), so a long object can lose its tail ("loves the energy" from "I
love the energy, diversity, and food of this city"). Free-text objects and
values keep the speaker's words, including "my".

What it does not do: names without a relation word ("Ana came over"),
third-person statements ("she lives in Paris"),
negations ("I don't live in Porto" is skipped, not inverted), questions,
pronoun resolution ("I love it"), past relations ("my ex"), habits,
documents, anything spread over several turns, and any inference.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

KIND_PERSON = "user_specific"
KIND_PLACE = "place"
KIND_NOTE = "document"


@dataclass(frozen=True)
class Candidate:
    kind: str
    subject: str
    key: str
    value: str
    confidence: float
    rule: str


# Confidence by key family: every rule that can write a key uses the same
# confidence, so a later statement is never out-weighed by an earlier one
# merely because a different rule phrased it.
CONF_RELATION = 0.8
CONF_HOME = 0.8
CONF_ORIGIN = 0.8
CONF_VISITED = 0.6
CONF_PREFERENCE = 0.7
CONF_JOB = 0.75
CONF_PET = 0.75
CONF_DATE = 0.8
CONF_PLAN = 0.6
CONF_EVENT = 0.6

SINGLE_RELATIONS = {
    "husband": "husband", "wife": "wife", "partner": "partner", "boyfriend": "boyfriend",
    "girlfriend": "girlfriend", "fiance": "fiance", "fiancé": "fiance", "fiancee": "fiancee",
    "fiancée": "fiancee", "mom": "mother", "mum": "mother", "mother": "mother",
    "dad": "father", "father": "father", "boss": "boss",
}
MULTI_RELATIONS = {
    "sister": "sister", "brother": "brother", "son": "son", "daughter": "daughter",
    "friend": "friend", "best friend": "best friend", "cousin": "cousin", "aunt": "aunt",
    "uncle": "uncle", "niece": "niece", "nephew": "nephew", "grandma": "grandmother",
    "grandmother": "grandmother", "grandpa": "grandfather", "grandfather": "grandfather",
    "grandson": "grandson", "granddaughter": "granddaughter", "colleague": "colleague",
    "coworker": "colleague", "co-worker": "colleague", "roommate": "roommate",
    "neighbor": "neighbour", "neighbour": "neighbour", "mentor": "mentor",
    "stepmom": "stepmother", "stepdad": "stepfather", "kid": "child", "child": "child",
}
_REL_WORDS = sorted([*SINGLE_RELATIONS, *MULTI_RELATIONS], key=len, reverse=True)
_REL = "(?:" + "|".join(re.escape(w) for w in _REL_WORDS) + ")"
_REL_ADJ = r"(?:(?:older|younger|little|big|twin|old|dear|good|close|new|baby)\s+)?"

OCCUPATIONS = frozenset("""
nurse teacher doctor engineer developer programmer designer artist painter writer
author journalist lawyer accountant architect chef cook baker waiter waitress barista
student scientist researcher professor lecturer pharmacist dentist therapist
counselor counsellor psychologist veterinarian vet mechanic electrician plumber
carpenter firefighter paramedic pilot farmer photographer musician singer dancer
actor actress librarian pastor priest soldier police officer cashier manager
consultant analyst translator editor tutor coach trainer social worker
""".split())

SPECIES = ("guinea pig", "dog", "cat", "puppy", "kitten", "pup", "horse", "bird",
           "parrot", "rabbit", "bunny", "hamster", "fish", "turtle", "snake", "pony")
_SPECIES = "(?:" + "|".join(re.escape(s) for s in SPECIES) + ")"

MONTHS = ("January February March April May June July August September October "
          "November December").split()
_MONTH = "(?:" + "|".join(MONTHS) + r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?)"
_WEEKDAY = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
DATE = (rf"(?:{_MONTH}\s+{_DAY}(?:,?\s+\d{{4}})?|(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}"
        rf"(?:,?\s+\d{{4}})?|{_WEEKDAY}|{_MONTH}(?:\s+\d{{4}})?)")
_PERIOD = r"(?:week|month|year|weekend|summer|winter|spring|fall|autumn|semester)"
WHEN = (rf"(?:on\s+{DATE}|(?i:next|this)\s+(?:{_PERIOD}|{_WEEKDAY})|(?i:tomorrow|tonight)"
        rf"|in\s+{_MONTH}|(?i:in\s+(?:a\s+few|two|three|a\s+couple\s+of)\s+"
        r"(?:days|weeks|months)))")

# Names and places: capitalised words; the first may not be a function word.
_CAP = r"[A-Z][a-zA-Z.-]*[a-zA-Z]"
NAME = rf"{_CAP}(?:\s+{_CAP})?"
PLACE = rf"{_CAP}(?:\s+(?:of\s+|de\s+|la\s+)?{_CAP}){{0,3}}"
NOT_NAMES = frozenset("""
I I'm I've I'd I'll The A An My Our Your His Her Their It It's This That These Those
He She We They You Me And But Or So If Then Yes No Oh Ok Okay Wow Thanks Thank Hey Hi
Hello Well Just Also Too Really Very Mom Mum Dad Mother Father Sister Brother Friend
God Lol Haha Omg
""".split()) | set(MONTHS) | {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                             "Saturday", "Sunday"}

# A free-text object ("coffee", "hiking in the mountains"): a few words, up to
# a clause boundary.
_OBJ_WORD = r"[\w'+&-]+"
OBJ = rf"{_OBJ_WORD}(?:\s+{_OBJ_WORD}){{0,5}}"
_OBJ_STOP = frozenset("""
and but because so when while with since as if though although or which who that
too also really very so lot like lately anymore now right here there today
yesterday tonight tomorrow than for last next this recently ago earlier after
before during what how where why
""".split())
# Prepositions end a noun object ("a travel agency | to see") but belong to a
# verb's ("getting lost in fantasy stories").
_PREP_STOP = frozenset("at in on from into onto through throughout to by over about".split())
_OBJ_BAD_START = frozenset("""
it it's that this these those you your them him her me us how what when where why
who whom doing having there here so just to-do one ones something anything
everything nothing some any all both myself yourself lots is was are were has have had
not no never their its his
""".split())
_VAGUE = frozenset("""
going playing getting being doing making having seeing it all them
""".split())
_ARTICLES = frozenset({"a", "an", "the", "my", "our", "some"})
_NEGATION = re.compile(r"(?i)(?:\bnot|\bnever|n't|\bno\s+longer)\b[^.]*$")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?;])\s+|\n+", text) if s.strip()]


def slug(text: str) -> str:
    """A key part from free text: lower case, articles and punctuation out,
    words joined by underscores ("the Grand Canyon!" -> "grand_canyon")."""
    words = re.findall(r"[\w]+", text.lower().replace("'s", ""))
    while words and words[0] in _ARTICLES:
        words = words[1:]
    return "_".join(words)


def _clean_name(name: str) -> str | None:
    words = name.split()
    # Drop trailing function words that the capitalised run swallowed.
    while words and words[-1] in NOT_NAMES:
        words.pop()
    if not words or words[0] in NOT_NAMES or words[0] in ("I",):
        return None
    return " ".join(words).rstrip(".'")


def _clean_obj(obj: str) -> str | None:
    words = obj.split()
    verbal = bool(words) and (words[0].lower().endswith("ing") or words[0].lower() == "to")
    for i, word in enumerate(words):
        if not any(ch.isalnum() for ch in word):  # a dash, an ampersand: a new clause
            words = words[:i]
            break
        bare = word.lower().strip("'")
        if i > 0 and (bare in _OBJ_STOP or (bare in _PREP_STOP and not verbal)):
            words = words[:i]
            break
    while words and words[-1].lower() in _ARTICLES | {"to", "of", "in", "at", "on"}:
        words.pop()
    if not words or words[0].lower() in _OBJ_BAD_START:
        return None
    if words[0].lower() in _ARTICLES and len(words) == 1:
        return None
    return " ".join(words)


def _negated(sentence: str, start: int) -> bool:
    """A negation or a question in the clause before the match."""
    before = sentence[:start]
    return _NEGATION.search(before[-25:]) is not None


# -- the rules --------------------------------------------------------------

_I = r"(?i:\bI)"
_WE = r"(?i:\b(?:I|we))"


def _relations(s: str, who: str) -> Iterator[Candidate]:
    patterns = (
        rf"(?i:\bmy\s+){_REL_ADJ}(?P<rel>(?i:{_REL}))(?:,)?\s+(?P<name>{NAME})",
        rf"(?i:\bmy\s+){_REL_ADJ}(?P<rel>(?i:{_REL}))(?i:'s\s+name\s+is|\s+is\s+called|"
        rf"\s+is\s+named)\s+(?P<name>{NAME})",
        rf"\b(?P<name>{NAME})(?i:\s+is\s+my\s+){_REL_ADJ}(?P<rel>(?i:{_REL}))\b",
    )
    for pattern in patterns:
        for m in re.finditer(pattern, s):
            name = _clean_name(m.group("name"))
            if name is None or _negated(s, m.start()):
                continue
            word = m.group("rel").lower()
            if word in SINGLE_RELATIONS:
                yield Candidate(KIND_PERSON, who, SINGLE_RELATIONS[word].replace(" ", "_"),
                                name, CONF_RELATION, "relation")
            else:
                yield Candidate(KIND_PERSON, name, f"relation_to_{slug(who)}",
                                MULTI_RELATIONS[word], CONF_RELATION, "relation")


def _places(s: str, who: str) -> Iterator[Candidate]:
    rules = (
        (rf"{_WE}(?i:\s+(?:currently\s+|now\s+|still\s+)?live\s+in\s+)", "lives_in",
         "lives_in", CONF_HOME),
        (rf"{_WE}(?i:\s+(?:just\s+|recently\s+|finally\s+)?(?:moved|relocated)\s+to\s+)",
         "lives_in", "moved_to", CONF_HOME),
        (rf"{_I}(?i:\s+grew\s+up\s+in\s+)", "grew_up_in", "grew_up_in", CONF_ORIGIN),
        (rf"{_I}(?i:(?:'m|\s+am)\s+(?:originally\s+)?from\s+)", "is_from", "is_from",
         CONF_ORIGIN),
    )
    for lead, key, rule, conf in rules:
        for m in re.finditer(lead + rf"(?:the\s+)?(?P<place>{PLACE})", s):
            place = _clean_name(m.group("place"))
            if place is None or _negated(s, m.start()):
                continue
            yield Candidate(KIND_PLACE, who, key, place, conf, rule)
    visit = (rf"{_WE}(?i:\s+(?:just\s+|recently\s+|finally\s+|once\s+|also\s+)?"
             r"(?:visited|went\s+to|traveled\s+to|travelled\s+to|took\s+a\s+trip\s+to|"
             r"flew\s+to|have\s+been\s+to|'ve\s+been\s+to)\s+)"
             rf"(?:the\s+)?(?P<place>{PLACE})(?P<poss>[']s)?")
    for m in re.finditer(visit, s):
        place = _clean_name(m.group("place"))
        if place is None or m.group("poss") or _negated(s, m.start()):
            continue
        yield Candidate(KIND_PLACE, who, f"visited_{slug(place)}", place, CONF_VISITED,
                        "visited")


_PREF_VERBS = {"love": "loves", "like": "likes", "enjoy": "enjoys", "adore": "adores",
               "hate": "hates", "dislike": "dislikes", "prefer": "prefers",
               "can't stand": "can't stand"}


def _preferences(s: str, who: str) -> Iterator[Candidate]:
    verbs = "|".join(re.escape(v) for v in _PREF_VERBS)
    pref = (rf"{_I}(?i:\s+(?:really\s+|absolutely\s+|just\s+|also\s+|still\s+|totally\s+)?"
            rf"(?P<verb>{verbs})\s+)(?P<obj>{OBJ})")
    for m in re.finditer(pref, s):
        obj = _clean_obj(m.group("obj"))
        if obj is None or _negated(s, m.start()) or s.rstrip().endswith("?"):
            continue
        if re.search(r"(?i)\b(?:what|which|that|who|things?|one)\s+$", s[:m.start()]):
            continue  # "what I love makes it fun": the object is elsewhere
        if obj.lower() in _VAGUE:
            continue  # "I love going (on ...)": nothing left to pin down
        key = slug(obj.removeprefix("to "))
        if not key:
            continue
        verb = _PREF_VERBS[m.group("verb").lower()]
        yield Candidate(KIND_PERSON, who, f"preference_{key}", f"{verb} {obj}",
                        CONF_PREFERENCE, "preference")
    fan = rf"{_I}(?i:(?:'m|\s+am)\s+(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of\s+)(?P<obj>{OBJ})"
    for m in re.finditer(fan, s):
        obj = _clean_obj(m.group("obj"))
        if obj is None or _negated(s, m.start()) or not slug(obj):
            continue
        yield Candidate(KIND_PERSON, who, f"preference_{slug(obj)}", f"is a fan of {obj}",
                        CONF_PREFERENCE, "preference")
    allergy = rf"{_I}(?i:(?:'m|\s+am)\s+(?:very\s+|severely\s+)?allergic\s+to\s+)(?P<obj>{OBJ})"
    for m in re.finditer(allergy, s):
        obj = _clean_obj(m.group("obj"))
        if obj is None or _negated(s, m.start()):
            continue
        yield Candidate(KIND_PERSON, who, f"allergy_{slug(obj)}", f"allergic to {obj}",
                        CONF_PREFERENCE, "allergy")
    favourite = (r"(?i:\bmy\s+(?:all-time\s+)?favou?rite\s+)(?P<cat>[a-z]+(?:\s+[a-z]+)?)"
                 rf"(?i:\s+is\s+)(?P<obj>{OBJ})")
    for m in re.finditer(favourite, s):
        obj = _clean_obj(m.group("obj"))
        if obj is None or _negated(s, m.start()):
            continue
        yield Candidate(KIND_PERSON, who, f"favourite_{slug(m.group('cat'))}", obj,
                        CONF_PREFERENCE, "favourite")


def _jobs(s: str, who: str) -> Iterator[Candidate]:
    works_as = rf"{_I}(?i:\s+(?:now\s+|currently\s+)?work\s+as\s+(?:an?\s+)?)(?P<job>{OBJ})"
    for m in re.finditer(works_as, s):
        job = _clean_obj(m.group("job"))
        if job is None or _negated(s, m.start()):
            continue
        yield Candidate(KIND_PERSON, who, "occupation", " ".join(job.split()[:3]), CONF_JOB,
                        "works_as")
    jobs = "|".join(re.escape(j) for j in sorted(OCCUPATIONS, key=len, reverse=True))
    i_am = (rf"{_I}(?i:(?:'m|\s+am)\s+(?:now\s+)?an?\s+(?:(?:full-time|part-time|"
            rf"freelance|professional|retired|school|high\s+school|nursing|art)\s+)?)"
            rf"(?P<job>(?i:{jobs}))\b")
    for m in re.finditer(i_am, s):
        if _negated(s, m.start()):
            continue
        yield Candidate(KIND_PERSON, who, "occupation", m.group("job").lower(), CONF_JOB,
                        "occupation")
    works_at = (rf"{_I}(?i:\s+(?:now\s+|currently\s+)?work\s+(?:at|for)\s+)"
                rf"(?:the\s+)?(?P<org>{PLACE})")
    for m in re.finditer(works_at, s):
        org = _clean_name(m.group("org"))
        if org is None or _negated(s, m.start()):
            continue
        yield Candidate(KIND_PERSON, who, "works_at", org, CONF_JOB, "works_at")


def _pets(s: str, who: str) -> Iterator[Candidate]:
    patterns = (
        rf"(?i:\b(?:my|our)\s+(?:new\s+|little\s+|old\s+)?)(?P<sp>(?i:{_SPECIES}))"
        rf"(?:,)?(?i:\s+(?:named\s+|called\s+)?)(?P<name>{NAME})",
        rf"(?i:\b(?:my|our)\s+)(?P<sp>(?i:{_SPECIES}))(?i:[']s\s+name\s+is\s+)(?P<name>{NAME})",
        rf"{_WE}(?i:\s+(?:just\s+)?(?:have|got|adopted|rescued|had)\s+an?\s+(?:new\s+)?)"
        rf"(?P<sp>(?i:{_SPECIES}))(?i:\s+(?:named|called)\s+)(?P<name>{NAME})",
    )
    for pattern in patterns:
        for m in re.finditer(pattern, s):
            name = _clean_name(m.group("name"))
            if name is None or _negated(s, m.start()):
                continue
            species = m.group("sp").lower()
            yield Candidate(KIND_PERSON, who, f"pet_{slug(name)}", f"{species} named {name}",
                            CONF_PET, "pet")


_PLAN_VERB = (r"(?:going\s+to|visiting|moving\s+to|traveling\s+to|travelling\s+to|"
              r"flying\s+to|getting|having|starting|planning\s+to|planning\s+on|hoping\s+to|"
              r"thinking\s+(?:about|of)|gonna)")
_BE = r"(?i:(?:'re|'m|\s+are|\s+am|\s+will\s+be))"


def _dates(s: str, who: str) -> Iterator[Candidate]:
    birthday = rf"(?i:\bmy\s+birthday\s+is\s+)(?:on\s+)?(?P<date>{DATE})"
    for m in re.finditer(birthday, s):
        yield Candidate(KIND_PERSON, who, "birthday", m.group("date"), CONF_DATE, "birthday")
    after = (rf"{_WE}{_BE}(?i:\s+(?:also\s+|finally\s+)?)(?P<verb>(?i:{_PLAN_VERB}))\s+"
             rf"(?P<obj>{OBJ}?)\s+(?P<when>{WHEN})")
    before = (rf"(?P<when>{WHEN}),?\s+{_WE}{_BE}(?i:\s+(?:also\s+|finally\s+)?)"
              rf"(?P<verb>(?i:{_PLAN_VERB}))\s+(?P<obj>{OBJ})")
    seen: set[str] = set()
    for pattern in (after, before):
        for m in re.finditer(pattern, s):
            obj = _clean_obj(m.group("obj"))
            if obj is None or _negated(s, m.start()):
                continue
            key = slug(obj)
            if not key or key in seen:
                continue
            seen.add(key)
            verb = " ".join(m.group("verb").split()).lower()
            when = " ".join(m.group("when").split())
            when = when[0].lower() + when[1:]  # "Next month, ..." -> "next month"
            travel = verb != "getting" and verb != "having" and obj[:1].isupper()
            yield Candidate(KIND_PLACE if travel else KIND_PERSON, who, f"plan_{key}",
                            f"{verb} {obj} {when}", CONF_PLAN, "plan")


PAST_WHEN = (r"(?i:yesterday|today|this\s+(?:morning|afternoon|week|weekend|month)"
             rf"|last\s+(?:{_PERIOD}|{_WEEKDAY}|night|fri|sat|sun|mon|tue|wed|thu)"
             r"|(?:a\s+few|a\s+couple(?:\s+of)?|two|three|four|\d+|a)\s+"
             r"(?:days|weeks|weekends|months|years|day|week|month|year)\s+ago)\b")


def _when_near(s: str, start: int, end: int) -> str | None:
    """A past time said around a match: after it in the clause, else before it."""
    after = re.search(PAST_WHEN, s[end:end + 60])
    if after is not None:
        return after.group(0)
    before = list(re.finditer(PAST_WHEN, s[max(0, start - 40):start]))
    return before[-1].group(0) if before else None


def _events(s: str, who: str) -> Iterator[Candidate]:
    """Things the speaker went to or did: "I went to a pottery workshop last
    Friday", "we went camping two weekends ago", "I took my kids to a park"."""
    patterns = (
        rf"{_WE}(?i:\s+(?:just\s+|finally\s+|also\s+)?(?:went\s+to|attended|visited|"
        rf"took\s+(?:my|our|the)\s+\w+\s+to)\s+)(?P<obj>(?i:a|an|the)\s+{OBJ})",
        rf"{_WE}(?i:\s+(?:just\s+|finally\s+|also\s+)?went\s+)(?P<obj>[a-z]+ing\b(?:\s+{OBJ})?)",
    )
    for pattern in patterns:
        for m in re.finditer(pattern, s):
            if re.match(PAST_WHEN, s[m.start("obj"):]):
                continue  # "the parade I went to a few weeks ago": a time, not a thing
            raw = m.group("obj")
            cut = re.search(PAST_WHEN, raw)
            obj = _clean_obj(raw[:cut.start()] if cut else raw)
            if obj is None or _negated(s, m.start()):
                continue
            if re.match(r"(?i:the)\s+[A-Z]", obj):
                continue  # "visited the Grand Canyon": a place (see _places)
            key = slug(obj)
            if not key or key in ("home", "bed", "sleep", "work", "school", "place", "thing"):
                continue
            lead = " ".join(s[m.start():m.start("obj")].split()[1:])  # "went to", "went"
            lead = re.sub(r"(?i)^(?:just|finally|also)\s+", "", lead)
            end = s.find(obj, m.start("obj")) + len(obj)
            when = _when_near(s, m.start(), end)
            value = f"{lead} {obj}" + (f" {when[0].lower()}{when[1:]}" if when else "")
            yield Candidate(KIND_PERSON, who, f"event_{key}", value, CONF_EVENT, "event")


_RULES = (_relations, _places, _preferences, _jobs, _pets, _dates, _events)


def extract(content: str, speaker: str) -> list[Candidate]:
    """The facts the rules find in one turn said by ``speaker``, in order,
    without repeats (same subject and key: the first wins)."""
    out: list[Candidate] = []
    seen: set[tuple[str, str]] = set()
    content = content.replace("\u2019", "'")  # typographic apostrophes
    for sentence in _sentences(content):
        if sentence.endswith("?"):
            continue  # questions assert nothing
        for rule in _RULES:
            for cand in rule(sentence, speaker):
                if (cand.subject.lower(), cand.key) not in seen:
                    seen.add((cand.subject.lower(), cand.key))
                    out.append(cand)
    return out


# -- "remember: ..." -----------------------------------------------------------

_REMEMBER = re.compile(r"^\s*(?:(?:please|hey|ok|okay)[,\s]+)?remember(?:\s*[:,-]\s*|\s+that\s+)"
                       r"(?P<text>.+?)\s*$", re.IGNORECASE | re.DOTALL)
_TOPIC = re.compile(r"^(?P<topic>.{1,60}?)\s+(?:is|are|was|were|goes|go|lives|lands)\s+",
                    re.IGNORECASE)


def remembered(content: str) -> str | None:
    """What a turn asks to remember ("remember: X", "remember that X"), or None."""
    m = _REMEMBER.match(content)
    if m is None:
        return None
    text = m.group("text").strip()
    if not text or text.endswith("?"):
        return None
    return text


def note_key(text: str) -> str:
    """A stable key for a remembered note: its topic ("the spare key is under
    the pot" -> ``note_spare_key``), so that a later note on the same topic
    supersedes it; or its first words when it has no "X is ..." shape."""
    m = _TOPIC.match(text)
    topic = slug(m.group("topic")) if m else "_".join(slug(text).split("_")[:6])
    return "note_" + (topic or "untitled")[:120]
