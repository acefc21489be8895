#!/usr/bin/env python3
"""A plain-text perplexity corpus from ShareGPT first human turns, for engines that read a text file (llama-perplexity).

Seeded shuffle of the conversations, then the first human turns of 200-4,000 ASCII characters, joined by blank lines,
until CHARS characters. Reads the dataset as scripts/setup.sh fetches it (the array may be cut short: the complete
conversations before the cut are used).

Usage: python3 scripts/sharegpt_text.py OUT.txt [--chars 260000] [--seed 7] [--dataset PATH]
"""
import argparse
import json
import random

ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
ap.add_argument('out')
ap.add_argument('--chars', type=int, default=260000)
ap.add_argument('--seed', type=int, default=7)
ap.add_argument('--dataset', default='datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json')
a = ap.parse_args()
text = open(a.dataset).read()
decoder, i, conversations = json.JSONDecoder(), text.index('[') + 1, []
while True:
    while i < len(text) and text[i] in ' \n\r\t,':
        i += 1
    try:
        item, i = decoder.raw_decode(text, i)
    except ValueError:
        break
    conversations.append(item)
random.Random(a.seed).shuffle(conversations)
turns, total = [], 0
for c in conversations:
    conv = c.get('conversations') or []
    if not conv or conv[0].get('from') != 'human':
        continue
    t = conv[0]['value'].strip()
    if 200 <= len(t) <= 4000 and t.isascii():
        turns.append(t)
        total += len(t)
        if total > a.chars:
            break
open(a.out, 'w').write('\n\n'.join(turns))
print(f'{a.out}: {len(turns)} turns, {total} characters')
