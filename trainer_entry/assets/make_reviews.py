"""Generate ``reviews.jsonl``: the small labelled review set tunematrix ships.

Run from the repository root: ``python trainer_entry/assets/make_reviews.py``.
The output is committed; this script documents where it came from and makes
it reproducible (a fixed seed, no randomness from elsewhere). All text here is
written for this project. Each record is a short review of a product or a film
with the fields ``text`` and ``label``; ``label`` is one of three class names,
``negative``, ``mixed`` and ``positive``, in equal numbers. Lengths vary from
one sentence to a dozen, so that batches pad as they do on real data. It is
what the ``seq-classification`` task trains on when a scenario names no dataset.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "reviews.jsonl"

#: records per class; three classes
PER_CLASS = 120
LABELS = ("negative", "mixed", "positive")

PRODUCTS = {
    "kettle": ["the lid", "the handle", "the switch", "the spout", "the base"],
    "pair of headphones": ["the sound", "the battery", "the padding", "the cable", "the case"],
    "desk lamp": ["the light", "the arm", "the switch", "the base", "the dimmer"],
    "backpack": [
        "the main zip",
        "the shoulder strap",
        "the side pocket",
        "the fabric",
        "the laptop sleeve",
    ],
    "coffee grinder": ["the blade", "the motor", "the lid", "the dial", "the cup"],
    "phone charger": ["the cable", "the plug", "the connector", "the charging speed", "the cord"],
    "rain jacket": ["the hood", "the zip", "the stitching", "the collar", "the lining"],
    "bread knife": ["the blade", "the handle", "the edge", "the tip", "the balance"],
    "garden hose": ["the nozzle", "the coupling", "the reel", "the hose itself", "the valve"],
    "wireless mouse": [
        "the scroll wheel",
        "the left button",
        "the battery",
        "the receiver",
        "the grip",
    ],
    "electric toothbrush": [
        "the brush head",
        "the battery",
        "the timer",
        "the charger",
        "the mode switch",
    ],
    "office chair": ["the seat", "the armrest", "the castor", "the back rest", "the lever"],
}

FILMS = {
    "the heist film": ["the plot", "the lead actor", "the score", "the ending", "the car chase"],
    "the space drama": [
        "the visual design",
        "the script",
        "the pacing",
        "the soundtrack",
        "the cast",
    ],
    "the family comedy": [
        "the humour",
        "the young cast",
        "the pacing",
        "the ending",
        "the dialogue",
    ],
    "the war epic": ["the battle sequence", "the script", "the score", "the length", "the cast"],
    "the ghost story": [
        "the atmosphere",
        "the final scare",
        "the sound design",
        "the twist",
        "the house",
    ],
    "the musical": [
        "the music",
        "the dancing",
        "the costume design",
        "the story",
        "the lead singer",
    ],
    "the detective series": [
        "the mystery",
        "the detective",
        "the villain",
        "the second episode",
        "the finale",
    ],
    "the nature documentary": [
        "the camera work",
        "the narration",
        "the music",
        "the wildlife footage",
        "the editing",
    ],
    "the animated film": [
        "the animation",
        "the voice acting",
        "the theme song",
        "the story",
        "the humour",
    ],
    "the courtroom drama": [
        "the trial",
        "the lawyer",
        "the script",
        "the verdict",
        "the cast",
    ],
}

PRAISE = {
    "product": [
        "{part} is excellent",
        "{part} works perfectly",
        "{part} exceeded what I expected",
        "{part} feels really well made",
        "{part} has held up well",
        "I love {part}",
    ],
    "film": [
        "{part} is superb",
        "{part} kept me gripped",
        "{part} is the best I have seen in years",
        "{part} is a real highlight",
        "{part} made me laugh and cry",
        "I loved {part}",
    ],
}
COMPLAINTS = {
    "product": [
        "{part} broke within a week",
        "{part} feels cheap",
        "{part} never worked properly",
        "{part} is badly designed",
        "{part} started to rattle after a few days",
        "I cannot stand {part}",
    ],
    "film": [
        "{part} is a real letdown",
        "{part} dragged on and on",
        "{part} made no sense at all",
        "{part} is the weakest part by far",
        "{part} was a disappointment from the start",
        "I could not stand {part}",
    ],
}

OPEN = {
    "negative": [
        "I regret buying {thing}.",
        "Save your money and skip {thing}.",
        "{Thing} was a waste of an evening.",
        "I wanted to like {thing}, but I could not.",
        "Do not bother with {thing}.",
        "{Thing} is one of the worst I have tried.",
    ],
    "mixed": [
        "{Thing} has good and bad sides.",
        "I have mixed feelings about {thing}.",
        "{Thing} is fine, but no more than that.",
        "Some of {thing} is great and some of it is not.",
        "{Thing} does the job, with a few reservations.",
        "I am still not sure what I think of {thing}.",
    ],
    "positive": [
        "I am very happy with {thing}.",
        "{Thing} is a delight.",
        "I would recommend {thing} to anyone.",
        "{Thing} is worth every penny.",
        "What a pleasant surprise {thing} turned out to be.",
        "{Thing} is simply wonderful.",
    ],
}

CLOSE = {
    "negative": [
        "I am sending it back.",
        "One star, and that is generous.",
        "Avoid.",
        "I would not recommend it to a friend.",
        "Never again.",
    ],
    "mixed": [
        "Three stars.",
        "It is worth it on sale, not at full price.",
        "Good enough, but I expected more.",
        "I might give it another chance.",
        "Neither a triumph nor a disaster.",
    ],
    "positive": [
        "Five stars.",
        "I would buy it again without thinking twice.",
        "Highly recommended.",
        "I will be telling my friends about it.",
        "A clear favourite.",
    ],
}

ASIDES = {
    "product": [
        "It arrived on a rainy Tuesday.",
        "I have used it every day for a month.",
        "The packaging was plain cardboard.",
        "It was a birthday present.",
        "It took a while to get used to.",
    ],
    "film": [
        "I watched it with my sister.",
        "We saw it at the small cinema in town.",
        "A friend had told me about it.",
        "I read a few reviews before going.",
        "The cinema was almost empty.",
    ],
}


def _part_sentence(rng: random.Random, label: str, kind: str, part: str) -> str:
    good = label == "positive" or (label == "mixed" and rng.random() < 0.5)
    phrase = rng.choice((PRAISE if good else COMPLAINTS)[kind]).format(part=part)
    return phrase[0].upper() + phrase[1:] + "."


def review(rng: random.Random, label: str) -> str:
    """One review of a random product or film, in the voice of ``label``."""
    if rng.random() < 0.5:
        kind = "product"
        name, parts = rng.choice(sorted(PRODUCTS.items()))
        thing = f"this {name}"
    else:
        kind = "film"
        thing, parts = rng.choice(sorted(FILMS.items()))
    opening = rng.choice(OPEN[label]).format(thing=thing, Thing=thing[0].upper() + thing[1:])
    size = rng.choice([0, 0, 1, 1, 2, 3, 5, 8, 11])
    body = []
    chosen = [rng.choice(parts) for _ in range(size)]
    if label == "mixed" and size >= 2:
        # a mixed review says at least one good and one bad thing
        body.append(_part_sentence(rng, "positive", kind, chosen[0]))
        body.append(_part_sentence(rng, "negative", kind, chosen[1]))
        chosen = chosen[2:]
    body.extend(_part_sentence(rng, label, kind, part) for part in chosen)
    body = list(dict.fromkeys(body))  # no sentence twice
    if body and rng.random() < 0.4:
        body.insert(rng.randrange(len(body) + 1), rng.choice(ASIDES[kind]))
    closing = [rng.choice(CLOSE[label])] if size or rng.random() < 0.5 else []
    return " ".join([opening, *body, *closing])


def records(rng: random.Random) -> list[dict[str, str]]:
    out = [
        {"text": review(rng, label), "label": label} for label in LABELS for _ in range(PER_CLASS)
    ]
    rng.shuffle(out)
    return out


def main() -> None:
    data = records(random.Random(20260131))
    with OUT.open("w", encoding="utf-8") as f:
        for record in data:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {len(data)} records to {OUT}")


if __name__ == "__main__":
    main()
