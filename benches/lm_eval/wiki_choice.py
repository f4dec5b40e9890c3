"""Writes a multiple-choice task of N items made from a raw WikiText file as JSON Lines
`{"context", "choices", "label"}`: each item is the first two thirds of a sentence (at most 40
words), its next 1-6 words as the right choice and three spans of 1-8 words from other
sentences as the wrong ones, in a random order. The choices' lengths differ, so lm-eval's
length-sorted order spreads a context's choices over its requests, as in ARC or HellaSwag.

    python3 wiki_choice.py wiki.test.raw N > wiki_choice.jsonl
"""

import json
import random
import re
import sys

rng = random.Random(53)
with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
sentences = [
    s.split()
    for line in text.split("\n")
    if line.strip() and not line.strip().startswith("=")
    for s in re.split(r"(?<=[.!?]) ", line.strip())
]
sentences = [s for s in sentences if 12 <= len(s) <= 80]
rng.shuffle(sentences)
n = int(sys.argv[2])
for s in sentences[:n]:
    cut = min(len(s) * 2 // 3, 40)
    right = " " + " ".join(s[cut:cut + rng.randint(1, 6)])
    wrong = []
    while len(wrong) < 3:
        o = rng.choice(sentences)
        at = rng.randrange(len(o))
        span = " " + " ".join(o[at:at + rng.randint(1, 8)])
        if span != right and span not in wrong:
            wrong.append(span)
    label = rng.randrange(4)
    choices = wrong[:label] + [right] + wrong[label:]
    print(json.dumps({"context": " ".join(s[:cut]), "choices": choices, "label": label}))
