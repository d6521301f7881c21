"""DIPPER (Krishna et al. 2023, "Paraphrasing evades detectors of AI-generated text"): a T5 fine-tuned to paraphrase
a text a few sentences at a time, steered by two control codes, the lexical and the order diversity of the output.

Each text is whitespace-normalised and cut into sentences; every window of ``sent_interval`` sentences is rewritten
from the input ``"lexical = {100 - lexical}, order = {100 - order}"`` + ``" " + prefix`` (when there is one) +
``" <sent> {window} </sent>"``. The prefix starts as the prompt the text continues and grows by each window's
output, so later windows see the earlier paraphrase; the outputs, joined by spaces, are the paraphrased text.
Sampling as in the paper's code: nucleus sampling with ``top_p`` 0.75, no top-k, at most ``max_length`` tokens.
The paper's checkpoint is a T5-XXL (11B) with the T5 v1.1 tokenizer; the tiny preset uses a small paraphraser built
here in the same format (``builtin:tiny-paraphraser``, attacks/tiny_paraphraser.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from attacks.base import AttackContext, TextAttack
from harness.config.plugins import Params

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


def cut_long(sentences: list[str], max_words: int | None) -> list[str]:
    """``sentences`` with each one longer than ``max_words`` words cut into consecutive pieces of at most that many."""
    if max_words is None:
        return sentences
    out = []
    for sentence in sentences:
        words = sentence.split()
        out += [" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words)]
    return out


def dipper_input(lexical: int, order: int, prefix: str, window: str) -> str:
    """The text DIPPER reads for one window; ``lexical`` and ``order`` are the requested diversities (0..100)."""
    text = f"lexical = {100 - lexical}, order = {100 - order}"
    if prefix:
        text += f" {prefix}"
    return text + f" <sent> {window} </sent>"


def _diversity(value: int) -> int:
    if value not in DIVERSITIES:
        raise ValueError(f"must be one of {', '.join(map(str, DIVERSITIES))} (DIPPER's control codes), not {value}")
    return value


class DipperParams(Params):
    lexical: int = 60  # lexical diversity of the output (0 = keep the words)
    order: int = 0  # order diversity of the output (0 = keep the order of the content)
    model: str = "kalpeshk2011/dipper-paraphraser-xxl"
    tokenizer: str | None = "google/t5-v1_1-xxl"  # None: the model folder's own tokenizer
    sent_interval: int = Field(3, gt=0)
    # Not in DIPPER: a sentence longer than this many words is cut into pieces of at most this many, each rewritten
    # as a sentence of its own (None: DIPPER's windows, whole sentences). For a paraphraser trained on short windows.
    max_window_words: int | None = Field(None, gt=0)
    top_p: float = Field(0.75, gt=0, le=1)
    max_length: int = Field(512, gt=1)
    seed: int = 0
    batch_size: int = Field(32, gt=0)  # windows per generate call; it changes which random draw goes to which text

    @field_validator("lexical", "order")
    @classmethod
    def _check_diversity(cls, value: int) -> int:
        return _diversity(value)


class Dipper(TextAttack):
    name = "dipper"
    category = "Paraphrase"
    label = "DIPPER"
    description = "DIPPER paraphrasing"
    version = "1"
    Params = DipperParams

    def model_refs(self) -> dict[str, str]:
        refs = {"paraphraser": self.params.model}
        if self.params.tokenizer is not None:
            refs["tokenizer"] = self.params.tokenizer
        return refs

    def config_label(self) -> str:
        return f"lex={self.params.lexical}, order={self.params.order}"

    def load(self, ctx: AttackContext):
        """The paraphraser (eval mode, on ``ctx.device``) and its tokenizer, from safetensors unless pickles are
        allowed."""
        from transformers import AutoModelForSeq2SeqLM

        from harness.assets import models
        from harness.config.errors import HarnessError, first_line

        found = ctx.models or {}
        path = found.get("paraphraser", self.params.model)
        tokenizer = models.load_tokenizer(found.get("tokenizer", self.params.tokenizer or path))
        if Path(path).is_dir():
            models.check_weights(Path(path), path)
        try:
            model = AutoModelForSeq2SeqLM.from_pretrained(
                path, dtype="auto", use_safetensors=None if models.pickle_allowed() else True
            )
        except (OSError, ValueError) as err:
            raise HarnessError(f"cannot load paraphraser '{path}': {first_line(err)}") from None
        return model.to(ctx.device).eval().requires_grad_(False), tokenizer

    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        import torch

        model, tokenizer = self.load(ctx)
        p = self.params
        prompts = ctx.prompts if ctx.prompts is not None else [""] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError(f"{len(prompts)} prompts for {len(texts)} texts")
        windows = [
            [" ".join(s[i : i + p.sent_interval]) for i in range(0, len(s), p.sent_interval)]
            for s in (cut_long(split_sentences(t), p.max_window_words) for t in texts)
        ]
        prefixes = [" ".join(prompt.split()) for prompt in prompts]
        outputs: list[list[str]] = [[] for _ in texts]
        device = torch.device(ctx.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(p.seed)
            # Window j of every text in one pass (batched); a text's windows go in order, each seeing the last.
            for j in range(max(map(len, windows), default=0)):
                todo = [i for i, w in enumerate(windows) if j < len(w)]
                for start in range(0, len(todo), p.batch_size):
                    batch = todo[start : start + p.batch_size]
                    inputs = [dipper_input(p.lexical, p.order, prefixes[i], windows[i][j]) for i in batch]
                    for i, out in zip(batch, self.generate(model, tokenizer, inputs), strict=True):
                        outputs[i].append(out)
                        prefixes[i] = f"{prefixes[i]} {out}".strip()
        # A text with no sentences (empty or blank) has nothing to paraphrase and stays as it is.
        return [" ".join(" ".join(o).split()) if w else t for t, w, o in zip(texts, windows, outputs, strict=True)]

    def generate(self, model, tokenizer, inputs: list[str]) -> list[str]:
        """One batch of DIPPER inputs -> their sampled outputs. ``top_k=0`` is the reference's ``top_k=None``:
        nucleus sampling alone (None would fall back to the generation config's top-k of 50)."""
        import torch

        enc = tokenizer(inputs, return_tensors="pt", padding=True).to(model.device)
        with torch.no_grad():
            ids = model.generate(
                **enc, do_sample=True, top_p=self.params.top_p, top_k=0, max_length=self.params.max_length
            )
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
