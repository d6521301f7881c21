"""Text edits beside DIPPER: what a user does to a text by hand or with a simple script, each a text attack at a rate.

- ``token-edit``: Gu et al.'s robustness protocol, each token of the text (base tokenizer) replaced with probability
  ``p`` by a token drawn uniformly from the vocabulary's non-special tokens;
- ``token-insert``: before each token of the text, with probability ``p``, a token drawn the same way is inserted;
- ``word-delete``: each word (whitespace-separated) deleted with probability ``p``;
- ``synonym``: a share ``p`` of the words replaced by a WordNet synonym: each word that has one is replaced with
  probability ``p`` x words / words-with-a-synonym (at most 1), so that ``p`` of all words change where enough have
  one (nltk's WordNet, which must be downloaded once: the attack says how before any work where it is missing);
- ``typo``: each letter, with probability ``p``, swapped with the next, deleted, doubled or replaced by a random one;
- ``lowercase``: the whole text in lower case.

An edit changes only what it draws: the rest of the text, its newlines, indents and spacing included, is kept byte for
byte, so ``p = 0`` returns every text as it was. Each text's edit records the rate actually applied (``edited`` of
``units`` words, tokens or letters), which a synonym edit can leave below ``p`` where few words have a synonym.
Every random choice comes from a generator seeded by ``seed`` and the text's index, so a text's edits do not depend on
the other texts or on their order. Written here: these are a few lines each, and no maintained package applies them
to token ids with a seed per text while keeping the untouched text as it was.
"""

from __future__ import annotations

import random
import re
import string
from typing import ClassVar

from pydantic import Field

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.contract.attack import AttackContext, TextAttack
from harness.contract.plugin import Sweep


class RateParams(Params):
    p: float = Field(0.1, ge=0, le=1)  # the edit rate
    seed: int = 0


class TextEdit(TextAttack):
    """A text attack that edits each text on its own at rate ``p`` (``edit``), with a generator per text."""

    category = "Text edits"
    version = "2"  # 2: untouched text kept byte for byte (1 rejoined words with single spaces); rates recorded
    Params = RateParams
    unit: ClassVar[str] = "word"

    def config_label(self) -> str:
        return f"p={self.params.p:g}"

    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        return self.apply_texts_measured(texts, ctx)[0]

    def apply_texts_measured(self, texts: list[str], ctx: AttackContext) -> tuple[list[str], list[dict]]:
        """Each text edited (``edit``), with what was applied: ``{"unit", "units", "edited"}`` per text."""
        self.prepare(ctx)
        done = [self.edit(text, random.Random(f"{self.params.seed}:{i}")) for i, text in enumerate(texts)]
        return [t for t, _, _ in done], [{"unit": self.unit, "units": n, "edited": k} for _, n, k in done]

    def prepare(self, ctx: AttackContext) -> None:
        """Load what ``edit`` needs (a tokenizer, a lexicon) once per call."""

    def edit(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        """The edited text, how many units (words, tokens, letters) it had and how many were edited."""
        raise NotImplementedError


def _sweep(what: str) -> Sweep:
    return Sweep(f"edit rate p ({what} edited)", f"Text edits: {what}", setting="p")


# --- tokens ---------------------------------------------------------------------------------------------------------
class TokenEdits(TextEdit):
    """Edits of the text's tokens (base tokenizer) that splice new tokens' text into the original: each token's span
    of the text is cut at its start offset, so the spans tile the text and the untouched ones stay as they were."""

    unit = "token"

    def prepare(self, ctx: AttackContext) -> None:
        from harness.assets.models import load_tokenizer

        self.tokenizer = load_tokenizer(ctx.base_model)
        special = set(self.tokenizer.all_special_ids)
        self.choices = [i for i in range(len(self.tokenizer)) if i not in special]

    def spans(self, text: str) -> list[str]:
        """The text cut into one piece per token: piece ``i`` runs from token ``i``'s start to the next one's."""
        offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        cuts = [0]
        for start, _ in offsets[1:]:
            cuts.append(max(cuts[-1], start))
        cuts.append(len(text))
        return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)] if offsets else []

    def new_token(self, rng: random.Random) -> str:
        return self.tokenizer.decode([rng.choice(self.choices)], skip_special_tokens=True)

    def edit(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        pieces = self.spans(text)
        if self.params.p == 0 or not pieces:
            return text, len(pieces), 0
        out, edited = [], 0
        for piece in pieces:
            out.append(self.change(piece, rng))
            edited += out[-1] != piece
        return "".join(out), len(pieces), edited


class TokenEdit(TokenEdits):
    name = "token-edit"
    label = "Token edits"
    description = "random token substitution"
    sweep = _sweep("share of tokens")

    def change(self, piece: str, rng: random.Random) -> str:
        return self.new_token(rng) if rng.random() < self.params.p else piece


class TokenInsert(TokenEdits):
    name = "token-insert"
    label = "Token insertion"
    description = "random token insertion"
    sweep = _sweep("tokens inserted per token")

    def change(self, piece: str, rng: random.Random) -> str:
        return self.new_token(rng) + piece if rng.random() < self.params.p else piece


# --- words ----------------------------------------------------------------------------------------------------------
def words_and_gaps(text: str) -> tuple[list[str], list[str]]:
    """``text`` as whitespace-separated words and the gaps around them: gaps[0] + words[0] + gaps[1] + ... +
    words[-1] + gaps[-1] == text (one more gap than words)."""
    return re.findall(r"\S+", text), re.split(r"\S+", text)


def _stronger(gaps: list[str]) -> str:
    """The gap that stands for several merged ones: the one breaking most lines, then the longest (a deleted word
    between a newline and a space leaves the newline)."""
    return max(gaps, key=lambda g: (g.count("\n"), len(g)))


class WordDelete(TextEdit):
    name = "word-delete"
    label = "Word deletion"
    description = "random word deletion"
    sweep = _sweep("share of words")

    def edit(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        words, gaps = words_and_gaps(text)
        kept = [i for i in range(len(words)) if rng.random() >= self.params.p]
        if len(kept) == len(words):
            return text, len(words), 0
        if not kept:
            return "", len(words), len(words)
        out = [gaps[0]]  # the text's start and end stay as they were
        for a, b in zip(kept, kept[1:], strict=False):
            out += [words[a], _stronger(gaps[a + 1 : b + 1])]
        out += [words[kept[-1]], gaps[-1]]
        return "".join(out), len(words), len(words) - len(kept)


WORDNET_HELP = "pip install nltk && python -m nltk.downloader wordnet"


class Synonym(TextEdit):
    name = "synonym"
    label = "Synonyms"
    description = "WordNet synonym substitution"
    sweep = _sweep("share of words")

    def validate(self, base_model: str | None = None) -> None:
        wordnet_reader()

    def prepare(self, ctx: AttackContext) -> None:
        self.wordnet = wordnet_reader()
        self.cache: dict[str, list[str]] = {}

    def synonyms(self, word: str) -> list[str]:
        """WordNet's single-word lemmas of every sense of ``word``, other than the word itself, in WordNet's order."""
        if word in self.cache:
            return self.cache[word]
        found = self.cache[word] = []
        for synset in self.wordnet.synsets(word.lower()):
            for lemma in synset.lemma_names():
                if "_" not in lemma and lemma.lower() != word.lower() and lemma not in found:
                    found.append(lemma)
        return found

    def edit(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        words, gaps = words_and_gaps(text)
        if self.params.p == 0:
            return text, len(words), 0
        cores = [w.strip(string.punctuation) for w in words]
        options = [self.synonyms(c) if c.isalpha() else [] for c in cores]
        eligible = sum(bool(o) for o in options)
        rate = min(1.0, self.params.p * len(words) / eligible) if eligible else 0.0
        edited = 0
        for i, (word, core, found) in enumerate(zip(words, cores, options, strict=True)):
            if found and rng.random() < rate:
                pick = rng.choice(found)
                words[i] = word.replace(core, pick.capitalize() if core[0].isupper() else pick, 1)
                edited += 1
        return "".join(g + w for g, w in zip(gaps, [*words, ""], strict=True)), len(words), edited


def wordnet_reader():
    """nltk's WordNet reader, or one line naming what to install where nltk or its WordNet data is missing."""
    try:
        import nltk
        from nltk.corpus import wordnet
    except ImportError:
        raise HarnessError(f"the synonym attack needs nltk and its WordNet data: {WORDNET_HELP}") from None
    try:
        nltk.data.find("corpora/wordnet")
    except LookupError:
        try:
            nltk.data.find("corpora/wordnet.zip")
        except LookupError:
            raise HarnessError(f"the synonym attack needs WordNet's data for nltk: {WORDNET_HELP}") from None
    return wordnet


class Typo(TextEdit):
    name = "typo"
    label = "Typos"
    description = "character typos"
    sweep = _sweep("share of letters")

    unit = "letter"
    version = "1"  # (kept every character it did not draw from the start: its texts are those of version 1)

    def edit(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        chars, out, i, edited = list(text), [], 0, 0
        while i < len(chars):
            c = chars[i]
            if not c.isalpha() or rng.random() >= self.params.p:
                out.append(c)
                i += 1
                continue
            edited += 1
            kind = rng.randrange(4)
            if kind == 0 and i + 1 < len(chars):  # swap with the next character
                out += [chars[i + 1], c]
                i += 2
                continue
            if kind == 1:  # delete
                pass
            elif kind == 2:  # double
                out += [c, c]
            else:  # replace by another letter of the same case
                letters = string.ascii_uppercase if c.isupper() else string.ascii_lowercase
                out.append(rng.choice([x for x in letters if x != c]))
            i += 1
        return "".join(out), sum(c.isalpha() for c in chars), edited


class LowercaseParams(Params):
    pass


class Lowercase(TextAttack):
    name = "lowercase"
    category = "Text edits"
    label = "Lowercase"
    description = "lowercasing"
    version = "1"
    Params = LowercaseParams

    def config_label(self) -> str:
        return ""

    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        return [text.lower() for text in texts]
