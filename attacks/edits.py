"""Text edits beside DIPPER: what a user does to a text by hand or with a simple script, each a text attack at a rate.

- ``token-edit``: Gu et al.'s robustness protocol, each token of the text (base tokenizer) replaced with probability
  ``p`` by a token drawn uniformly from the vocabulary's non-special tokens;
- ``word-delete``: each word (whitespace-separated) deleted with probability ``p``;
- ``synonym``: each alphabetic word replaced with probability ``p`` by a WordNet synonym, where it has one (nltk's
  WordNet, which must be downloaded once: the attack says how before any work where it is missing);
- ``typo``: each letter, with probability ``p``, swapped with the next, deleted, doubled or replaced by a random one;
- ``lowercase``: the whole text in lower case.

Every random choice comes from a generator seeded by ``seed`` and the text's index, so a text's edits do not depend on
the other texts or on their order. Written here: these are a few lines each, and no maintained package applies them
to token ids with a seed per text.
"""

from __future__ import annotations

import random
import string
from typing import ClassVar

from pydantic import Field

from attacks.base import AttackContext, TextAttack
from harness.config.errors import HarnessError
from harness.config.plugins import Params, Sweep


class RateParams(Params):
    p: float = Field(0.1, ge=0, le=1)  # the edit rate
    seed: int = 0


class TextEdit(TextAttack):
    """A text attack that edits each text on its own at rate ``p`` (``edit``), with a generator per text."""

    category = "Text edits"
    version = "1"
    Params = RateParams
    unit: ClassVar[str] = "word"

    def config_label(self) -> str:
        return f"p={self.params.p:g}"

    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        self.prepare(ctx)
        return [self.edit(text, random.Random(f"{self.params.seed}:{i}")) for i, text in enumerate(texts)]

    def prepare(self, ctx: AttackContext) -> None:
        """Load what ``edit`` needs (a tokenizer, a lexicon) once per call."""

    def edit(self, text: str, rng: random.Random) -> str:
        raise NotImplementedError


def _sweep(what: str) -> Sweep:
    return Sweep(f"edit rate p ({what} edited)", f"Text edits: {what}", setting="p")


class TokenEdit(TextEdit):
    name = "token-edit"
    label = "Token edits"
    description = "random token substitution"
    sweep = _sweep("share of tokens")

    def prepare(self, ctx: AttackContext) -> None:
        from harness.assets.models import load_tokenizer

        self.tokenizer = load_tokenizer(ctx.base_model)
        special = set(self.tokenizer.all_special_ids)
        self.choices = [i for i in range(len(self.tokenizer)) if i not in special]

    def edit(self, text: str, rng: random.Random) -> str:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        edited = [rng.choice(self.choices) if rng.random() < self.params.p else i for i in ids]
        return self.tokenizer.decode(edited, skip_special_tokens=True)


class WordDelete(TextEdit):
    name = "word-delete"
    label = "Word deletion"
    description = "random word deletion"
    sweep = _sweep("share of words")

    def edit(self, text: str, rng: random.Random) -> str:
        return " ".join(w for w in text.split() if rng.random() >= self.params.p)


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

    def synonyms(self, word: str) -> list[str]:
        """WordNet's single-word lemmas of every sense of ``word``, other than the word itself, in WordNet's order."""
        found = []
        for synset in self.wordnet.synsets(word.lower()):
            for lemma in synset.lemma_names():
                if "_" not in lemma and lemma.lower() != word.lower() and lemma not in found:
                    found.append(lemma)
        return found

    def edit(self, text: str, rng: random.Random) -> str:
        out = []
        for word in text.split():
            core = word.strip(string.punctuation)
            if core.isalpha() and rng.random() < self.params.p:
                options = self.synonyms(core)
                if options:
                    pick = rng.choice(options)
                    pick = pick.capitalize() if core[0].isupper() else pick
                    word = word.replace(core, pick, 1)
            out.append(word)
        return " ".join(out)


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

    def edit(self, text: str, rng: random.Random) -> str:
        chars, out, i = list(text), [], 0
        while i < len(chars):
            c = chars[i]
            if not c.isalpha() or rng.random() >= self.params.p:
                out.append(c)
                i += 1
                continue
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
        return "".join(out)


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
