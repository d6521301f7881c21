"""Gu-AAR (Gu et al., "On the Learnability of Watermarks for Language Models"): Aaronson's watermark distilled into
the weights by sampling distillation, as Gu-KTH: the frozen base model writes training texts with AAR decoding
(methods/aar.py, bit for bit Gu et al.'s key and decoding; a stage of its own, reused by every student of the same
key and data), and the student is fine-tuned on them with cross-entropy. Gu et al. run k = 2, 3, 4.

Detection is their detector (the Gamma p-value of the summed ``-log(1 - u)``, ``p_value_gu``) beside the exact one
that counts each distinct (context, token) pair once (``p_value``; the pooled test of ``harness detect`` counts the
distinct pairs of all texts). No reference texts are needed: the null is the scheme's own.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.contract.method import (
    Detector,
    KeyFromTokenizer,
    PublishedDefault,
    TrainContext,
    WatermarkMethod,
    read_key,
    score_long_enough,
)


class GuAARParams(Params):
    k: int = Field(2, ge=1)  # previous tokens summed into the key's row (Gu et al.: 2, 3, 4)
    seed: int = Field(42, ge=0, lt=2**63)  # the key: Gu et al.'s DEFAULT_SEED, published; one's own for a secret key
    prompt_tokens: int = Field(50, gt=0)  # teacher prompts (Gu et al.: 50)
    batch_size: int | None = Field(None, gt=0)  # None: the preset's train.batch_size
    seq_len: int | None = Field(None, gt=1)  # None: the preset's train.seq_len
    generate_batch: int = Field(64, gt=0)  # teacher texts per generate call


class AARDetector(Detector):
    def __init__(self, key):
        from methods.aar import detection_uniforms

        self.key = key
        self.u = detection_uniforms(key)

    def check(self, ids: list[int]) -> None:
        if ids and not 0 <= min(ids) <= max(ids) < self.key.vocab_size:
            raise HarnessError(f"a token id outside the AAR key's {self.key.vocab_size} tokens (another tokenizer's?)")

    def score(self, sequences: list[list[int]]) -> list[dict]:
        from methods.aar import score_sequence

        def batch(seqs):
            out = []
            for seq in seqs:
                self.check(seq)
                s = score_sequence(self.u, self.key.k, seq)
                out.append({"score": s.score - s.scored, "statistic": s.score, "p_value": s.p_value,
                            "p_value_gu": s.p_value_gu, "scored": s.scored})  # fmt: skip
            return out

        return score_long_enough(sequences, self.key.k + 1, batch, {"score": 0.0, "p_value": 1.0, "p_value_gu": 1.0})

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict:
        """Gamma test of the summed ``-log(1 - u)`` over the distinct (row, token) pairs of all texts: exact."""
        import torch
        from scipy.stats import gamma

        k, pairs = self.key.k, set()
        for seq in sequences:
            self.check(seq)
            t = torch.tensor(seq)
            if len(t) > k:
                pairs.update(zip(t.unfold(0, k, 1)[:-1].sum(-1).tolist(), t[k:].tolist(), strict=True))
        if not pairs:
            return {"p_value": 1.0, "statistic": 0.0, "tokens": 0, "test": "AAR: no token after k to score"}
        rows, tokens = (torch.tensor(x) for x in zip(*sorted(pairs), strict=True))
        total = float((-torch.log(1 - self.u[rows, tokens])).double().sum())
        return {"p_value": float(gamma.sf(total, len(pairs))), "statistic": total, "tokens": len(pairs),
                "test": f"AAR: sum of -log(1-u) over the {len(pairs)} distinct (context, token) pairs of all texts, "
                        "Gamma(pairs, 1) under the null (exact)"}  # fmt: skip


class GuAAR(KeyFromTokenizer, WatermarkMethod):
    name = "gu-aar"
    label = "Gu-AAR"
    tradeoff_settings = ("k",)
    version = "1"
    Params = GuAARParams
    detector_has_null = True

    def config_label(self) -> str:
        return f"k={self.params.k}"

    def token_lengths(self) -> dict[str, int]:
        p = self.params
        return {"prompt_tokens + seq_len": p.prompt_tokens + p.seq_len} if p.seq_len else {}

    def validate(self, base_model: str | None = None) -> None:
        """The key table (V * k x V float32, built whole as Gu et al.'s) fits: refused before any work where not."""
        if base_model is None:
            return
        from harness.assets.models import vocab_length
        from methods.aar import MAX_TABLE_BYTES, AARKey

        key = AARKey(vocab_length(base_model), self.params.k, self.params.seed)
        if key.table_bytes() > MAX_TABLE_BYTES:
            raise HarnessError(
                f"{self.name}'s key table for {key.vocab_size} tokens at k={key.k} is "
                f"{key.table_bytes() / 2**30:.0f} GiB (V * k x V float32, as Gu et al. build it); at most "
                f"{MAX_TABLE_BYTES / 2**30:.0f} GiB"
            )

    def key(self, tokenizer):
        from methods.aar import AARKey

        return AARKey(vocab_size=len(tokenizer), k=self.params.k, seed=self.params.seed)

    def published_default(self) -> PublishedDefault:
        from methods.aar import DEFAULT_SEED

        return PublishedDefault(("key", "seed"), DEFAULT_SEED, "Gu et al.'s default key seed")

    def train(self, ctx: TrainContext, out: Path) -> dict:
        from methods.distill import sampling_distillation

        return sampling_distillation(self, ctx, out, "aar-teacher-texts", f"AAR teacher texts (k={self.params.k})",
                                     teacher_texts)  # fmt: skip

    def detection_key(self, tokenizer) -> dict:
        """What ``train`` writes as ``key.json`` for the base ``tokenizer``: the AAR key."""
        return {"method": self.name, "key": self.key(tokenizer).to_dict()}

    def detector(self, key_dir: Path, tokenizer=None, ctx=None) -> Detector:
        from methods.aar import AARKey

        return AARDetector(AARKey.from_dict(read_key(key_dir)["key"]))


def teacher_texts(ctx: TrainContext, key, count: int, prompt_tokens: int, new_tokens: int, batch: int, out: Path):
    """``count`` AAR-decoded continuations of exactly ``new_tokens`` tokens by the frozen base model, from the first
    ``prompt_tokens`` tokens of training documents (cycled through where the corpus holds fewer)."""
    import torch

    from harness.assets.models import load_causal_lm, load_tokenizer
    from harness.compute.progress import Progress
    from methods.aar import AARLogitsProcessor
    from methods.distill import teacher_prompts

    tokenizer = load_tokenizer(ctx.base_model)
    model = load_causal_lm(ctx.base_model, ctx.device)
    prompts = teacher_prompts(ctx, tokenizer, prompt_tokens, count)
    processor = AARLogitsProcessor(key)
    with open(out / "texts.jsonl", "w") as fh, Progress(count, "AAR teacher texts", unit="text") as bar:
        for start in range(0, count, batch):
            ids = torch.tensor(prompts[start : start + batch], device=model.device)
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens, logits_processor=[processor],
                                     pad_token_id=tokenizer.eos_token_id)  # fmt: skip
            for row in gen[:, ids.shape[1] :].tolist():
                fh.write(json.dumps({"text": tokenizer.decode(row, skip_special_tokens=True)}) + "\n")
            bar.update(len(ids))
    return {"texts": count, "distinct_prompts": len(set(map(tuple, prompts)))}
