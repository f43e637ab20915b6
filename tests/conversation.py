"""A two-person conversation of a few hundred turns over twelve days, for the
end-to-end tests of the subconscious (import, consolidate, facts, recall).

Written for the tests (no dataset text): each day has its own topic, with
statements of the shapes fact extraction knows (where people live, relatives,
jobs, pets, likes, plans) among ordinary chat."""

from __future__ import annotations

import json
from pathlib import Path

START = 1_751_356_800.0  # 2025-07-01 08:00 UTC
DAY = 86_400.0
SPEAKERS = ("Nora", "Ben")

OPENINGS = [
    ("Morning Ben! How are you doing today?", "Hi Nora! Pretty good, a bit tired. You?"),
    ("Hey Ben, got a minute to chat?", "Sure Nora, always. What's on your mind?"),
    ("Hi Ben! Long day?", "Hey Nora, not too bad actually. How about you?"),
]
CLOSINGS = [
    ("Anyway, I should get going. Talk soon!", "Bye Nora, take care!"),
    ("Right, dinner is calling. Speak tomorrow?", "Definitely, enjoy your evening!"),
]
SMALL_TALK = [
    [("How's the weather over there?", "Grey again, but dry at least."),
     ("Did you watch the match last night?", "Only the second half, what a finish!")],
    [("Are you sleeping any better?", "A little, the new pillow helps."),
     ("I need a holiday, honestly.", "Don't we all!")],
    [("Did the parcel ever arrive?", "Yes, finally, only a week late."),
     ("The trains were a mess this morning.", "They always are on Mondays.")],
]
REPLIES = [
    "Oh really? Tell me more about that.",
    "That sounds lovely, how did it go?",
    "Ha, I didn't know that about you!",
    "Wow, that's a big deal. How do you feel about it?",
    "I can picture it. Was it busy?",
    "Nice! I'd love to hear how it turns out.",
]
TOPICS: list[tuple[str, list[tuple[int, str]]]] = [
    ("home", [(0, "I live in Leeds, in a little terraced house near the park."),
              (1, "I grew up in Galway, so the Leeds weather feels familiar."),
              (0, "The park has a pond with herons in the mornings."),
              (1, "My brother Liam still lives in Galway with his kids."),
              (0, "We painted the kitchen yellow last weekend."),
              (1, "Yellow is brave! I would have gone for grey.")]),
    ("work", [(0, "I work as a nurse at the children's hospital."),
              (1, "I work at Harbour Books as a bookkeeper these days."),
              (0, "Night shifts are hard but the team is wonderful."),
              (1, "My boss Priya lets me work from home on Fridays."),
              (0, "We had three babies born on my ward on Tuesday."),
              (1, "Three in one night! That must have been chaos.")]),
    ("pets", [(0, "Our dog called Biscuit chewed the sofa again."),
              (1, "My cat Pepper only eats when I sit next to her."),
              (0, "Biscuit is a beagle, so he follows his nose everywhere."),
              (1, "Pepper is fifteen now and sleeps most of the day."),
              (0, "We take Biscuit to the beach at Whitby sometimes."),
              (1, "Whitby is lovely, the abbey ruins are worth the climb.")]),
    ("food", [(0, "I love Thai green curry, I could eat it every week."),
              (1, "I'm allergic to peanuts, so Thai food is tricky for me."),
              (0, "There's a peanut-free Thai place on Briggate."),
              (1, "I prefer Italian anyway, a good carbonara is perfect."),
              (0, "I made fresh pasta for the first time on Sunday."),
              (1, "Fresh pasta! Did it turn out well?")]),
    ("family", [(0, "My sister Ana is coming to stay next month."),
                (1, "My daughter Maya starts secondary school in September."),
                (0, "Ana works as a marine biologist in Plymouth."),
                (1, "Maya wants to learn the cello, the whole house will hear it."),
                (0, "Ana and I are planning a trip to Lisbon together."),
                (1, "Lisbon in spring would be perfect for that.")]),
    ("hobbies", [(0, "I love pottery, I go to a class every Thursday."),
                 (1, "I enjoy chess, I play online most evenings."),
                 (0, "This week I made a wobbly blue vase in pottery."),
                 (1, "I finally beat my friend Omar at chess on Monday."),
                 (0, "The pottery teacher says my glazing is improving."),
                 (1, "Omar wants a rematch on Saturday, of course.")]),
    ("garden", [(0, "We planted three apple trees at the bottom of the garden."),
                (1, "My tomatoes got blight, I lost almost all of them."),
                (0, "The apple trees came from a nursery in Harrogate."),
                (1, "Next year I'm growing courgettes instead of tomatoes."),
                (0, "The slugs ate every lettuce we planted in May."),
                (1, "Beer traps work for slugs, my dad swears by them.")]),
    ("travel", [(0, "We visited Edinburgh at Easter and climbed Arthur's Seat."),
                (1, "We went to Krakow last autumn for a long weekend."),
                (0, "The view from Arthur's Seat was worth the wind."),
                (1, "Krakow's old town square is beautiful at night."),
                (0, "Next summer we're going to Norway to see the fjords."),
                (1, "Norway is on my list too, maybe the Lofoten islands.")]),
    ("health", [(0, "I started running again, three mornings a week."),
                (1, "I hurt my knee playing football with Maya's team."),
                (0, "I'm training for the Leeds half marathon in October."),
                (1, "The physio says my knee needs six weeks of rest."),
                (0, "My best time for ten kilometres is now fifty four minutes."),
                (1, "Fifty four minutes is brilliant, well done!")]),
    ("move", [(0, "Big news: I moved to York last weekend!"),
              (1, "York! What made you leave Leeds?"),
              (0, "The new flat in York is right by the river Ouse."),
              (1, "Is Biscuit enjoying the river walks?"),
              (0, "Biscuit loves them, he jumped into the Ouse on day one."),
              (1, "Of course he did, classic beagle.")]),
    ("music", [(0, "I love jazz, we saw a trio at the Crescent on Friday."),
               (1, "Maya had her first cello lesson and it was loud."),
               (0, "The trio played a Thelonious Monk tune I adore."),
               (1, "Her teacher Mr Hale says she has a good ear."),
               (0, "My birthday is on March 3, I want concert tickets."),
               (1, "Noted! March 3, concert tickets.")]),
    ("plans", [(0, "Ana arrives on Friday and stays for two weeks."),
               (1, "We're going to Cornwall in August for a week."),
               (0, "I booked a pottery class for Ana and me on Saturday."),
               (1, "Cornwall means surfing lessons for Maya, she's thrilled."),
               (0, "Remember: the spare key to my flat is under the blue pot."),
               (1, "Got it, the blue pot. I'll water the plants if you need.")]),
]


def turns() -> list[dict[str, object]]:
    """Every line of the conversation, as ``reverie import`` reads them."""
    out: list[dict[str, object]] = []
    for day, (_, lines) in enumerate(TOPICS):
        t = START + day * DAY
        opening = OPENINGS[day % len(OPENINGS)]
        closing = CLOSINGS[day % len(CLOSINGS)]
        script: list[tuple[int, str]] = [(0, opening[0]), (1, opening[1])]
        for ask, answer in SMALL_TALK[day % len(SMALL_TALK)]:
            script += [(1, ask), (0, answer)]
        for n, (who, text) in enumerate(lines):
            script.append((who, text))
            script.append((1 - who, REPLIES[(day + n) % len(REPLIES)]))
        script += [(0, closing[0]), (1, closing[1])]
        for who, text in script:
            out.append({"speaker": SPEAKERS[who], "content": text, "created_at": t,
                        "channel": "chat"})
            t += 45.0
    return out


def write_jsonl(path: Path) -> int:
    lines = turns()
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)
