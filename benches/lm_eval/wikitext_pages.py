"""Writes the pages of EleutherAI/wikitext_document_level (lm-eval's `wikitext` task data) from
a raw WikiText file as JSON Lines `{"page": ...}`, following that data set's builder
(`_generate_examples`): lines split at "\n", a new page at each top-level ` = Title = `, pages
joined back with "\n", a blank page skipped except the last.

    python3 wikitext_pages.py wiki.test.raw > pages.jsonl
"""

import json
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    lines = f.read().split("\n")
pages, current = [], []
for line in lines:
    rline = line.replace("= = =", "===").replace("= =", "==").strip()
    if rline.startswith("= ") and rline.strip().endswith(" ="):
        page = "\n".join(current)
        if page.strip():
            pages.append(page)
        current = []
    current.append(line)
pages.append("\n".join(current))
for page in pages:
    print(json.dumps({"page": page}))
