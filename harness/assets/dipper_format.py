"""DIPPER's input format: what a DIPPER paraphraser reads (the paper's T5-XXL, and the tiny one built here,
tiny_paraphraser.py), and the sentences its windows are made of. The attack that prompts one (attacks/paraphrase.py)
and the build that trains the tiny one read it from here, so that the model and its prompts cannot drift apart."""

from __future__ import annotations

import re

DIVERSITIES = (0, 20, 40, 60, 80, 100)  # the control codes DIPPER was trained with

# Sentence splitting. The reference uses nltk's punkt, whose model is a separate download (nltk.download), which this
# harness cannot count on (offline machines); this rule covers what punkt does on plain prose: a sentence ends at
# . ! ? (and any closing quotes or brackets after it) followed by a space and an upper-case letter, a digit or an
# opening quote/bracket, except after common abbreviations and single-letter initials.
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s+[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "al", "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "no",
                  "fig", "eq", "vol", "approx", "inc", "ltd", "co", "u.s", "jan", "feb", "mar", "apr", "jun", "jul",
                  "aug", "sep", "sept", "oct", "nov", "dec"}  # fmt: skip


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (whitespace-normalised first), in order; an empty text has none."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _END.finditer(text):
        before = text[start : match.start()].split()
        word = before[-1].lower().lstrip("\"'([") if before else ""
        if match.group().startswith(".") and (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
            continue  # "e.g. The", "J. Smith": not the end of a sentence
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    rest = text[start:].strip()
    return [s for s in sentences if s] + ([rest] if rest else [])


def dipper_input(lexical: int, order: int, prefix: str, window: str) -> str:
    """The text DIPPER reads for one window; ``lexical`` and ``order`` are the requested diversities (0..100)."""
    text = f"lexical = {100 - lexical}, order = {100 - order}"
    if prefix:
        text += f" {prefix}"
    return text + f" <sent> {window} </sent>"
