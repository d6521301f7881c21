"""Distillation of the watermarked model into another (the cheapest laundering, and the radioactivity question of
Sander et al.): the attacker samples N texts from the watermarked (or already attacked) model on prompts of a
training split and fine-tunes another model on them, the unwatermarked base by default or a donor of the same
tokenizer. The row is the student's own texts scored with the owner's key; ``texts`` sweeps N (one student per N, from
the same teacher texts: the first N of them), and ``harness detect --model`` on a student says whether the key still
convicts it.

The teacher texts are drawn by the harness's own sampler (``harness.compute.generation.sample``: plain sampling at
temperature 1, a per-prompt draw keyed by ``seed``, exactly ``new_tokens`` tokens), continuing the first
``prompt_tokens`` tokens of the dataset's documents (its train split: never the documents evaluations read; the
pipeline refuses the preset's evaluation data itself); with N above the number of documents, the prompts repeat and
each repeat is a draw of its own. Each student is trained on its N texts, the loss on the sampled tokens alone (the
prompt is context), for ``epochs`` passes, by the fine-tuning attack's loop (``attacks/finetune.py``); the teacher
texts are kept in the stage (``teacher_texts.jsonl``) beside the students.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.config.settings import MAX_PROMPTS
from harness.contract.attack import AttackContext, ModelAttack, library_versions
from harness.contract.plugin import Sweep

BASE = "base"  # ``student``: the unwatermarked base of the run


class DistillParams(Params):
    texts: tuple[int, ...] = (1000,)  # N teacher texts per student, e.g. texts=100,1000,10000 (a student each)
    dataset: str = "c4-realnewslike"  # plain text whose documents' first tokens prompt the teacher (its train split)
    prompt_tokens: int = Field(32, gt=0)
    new_tokens: int = Field(200, gt=1)
    student: str = BASE  # "base", or a model reference (a folder, a hub id, a built-in) with the base's tokenizer
    epochs: float = Field(1.0, gt=0)  # passes over each student's N texts
    lr: float = Field(2e-5, gt=0)
    batch_size: int = Field(32, gt=0)
    warmup_steps: int = Field(0, ge=0)
    seed: int = 0
    # 0: every weight of the student trains; r > 0: LoRA adapters of rank r on every projection of its blocks
    # (alpha 2r, dropout 0.1, as the lora attack's defaults), merged into its float32 weights once trained.
    lora_rank: int = Field(0, ge=0)
    added_later = ("lora_rank",)

    @field_validator("texts", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            try:
                return tuple(int(p) for p in value.replace(";", ",").split(",") if p.strip())
            except ValueError:
                raise ValueError(
                    f"texts must be whole numbers separated by commas, e.g. 100,1000, not {value!r}"
                ) from None
        return value

    @field_validator("texts")
    @classmethod
    def _counts(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("give at least one number of texts")
        if any(n < 1 for n in value):
            raise ValueError(f"a student needs at least one teacher text, got {','.join(map(str, value))}")
        if max(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS:,} teacher texts")
        return tuple(sorted(set(value)))

    @field_validator("dataset")
    @classmethod
    def _plain_text(cls, value: str) -> str:
        from attacks.finetune import DATASETS

        if value in DATASETS and not DATASETS[value].plain_text:
            plain = ", ".join(k for k, d in DATASETS.items() if d.plain_text)
            raise ValueError(f"'{value}' is instruction pairs; the teacher's prompts come from plain text: {plain}")
        if value not in DATASETS and not Path(value).expanduser().exists():
            raise ValueError(
                f"unknown dataset '{value}': a plain-text name of the fine-tuning attack's or a local file"
            )
        return value


class Distill(ModelAttack):
    name = "distill"
    category = "Distillation"
    label = "Distillation"
    description = "distillation into another model from N teacher texts"
    sweep = Sweep("teacher texts N", "Distillation into {label}")
    tables = ("robustness", "curve")  # (the distillation table: AUC, TPR and tokens to detect per N)
    controlled = True  # a student of the unwatermarked base on N of its texts: the control of each row
    Params = DistillParams

    def source(self):
        from attacks.finetune import DATASETS
        from harness.config.settings import DataSource

        d = self.params.dataset
        return DATASETS[d].source if d in DATASETS else DataSource(path=d, text_field="text")

    def data_refs(self) -> dict:
        return {"prompts": self.source()}

    def model_refs(self) -> dict[str, str]:
        return {} if self.params.student == BASE else {"student": self.params.student}

    def token_lengths(self) -> dict[str, int]:
        return {"prompt_tokens + new_tokens": self.params.prompt_tokens + self.params.new_tokens + 1}

    def table_label(self) -> str:
        return "Distillation" if self.params.student == BASE else f"Distillation into {self.params.student}"

    def config_label(self) -> str:
        return f"N={','.join(map(str, self.params.texts))}"

    def outputs(self) -> list[tuple[str, str]]:
        return [(f"N={n}", student_folder(n)) for n in self.params.texts]

    def validate(self, base_model: str | None = None) -> None:
        from harness.compute.training import check_split

        check_split(self.params.batch_size, f"the distillation's batch_size ({self.params.batch_size})")
        if self.params.lora_rank:
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise HarnessError("distill with lora_rank needs the Python package 'peft': pip install "
                                   "'watermark-harness[lora]'")  # fmt: skip
            if base_model is not None:
                from types import SimpleNamespace

                from attacks.lora import LLAMA_PROJECTIONS, targeted_layers

                targeted_layers(
                    base_model, SimpleNamespace(rank=self.params.lora_rank, target_modules=LLAMA_PROJECTIONS)
                )
        if base_model is not None and self.params.student != BASE:
            from harness.assets.models import check_causal_lm, load_tokenizer, resolve

            check_causal_lm(resolve(self.params.student), self.params.student)  # (before its teacher texts are drawn)
            if (
                load_tokenizer(resolve(self.params.student)).get_vocab()
                != load_tokenizer(resolve(base_model)).get_vocab()
            ):
                raise HarnessError(
                    f"distill: the student '{self.params.student}' has another tokenizer than the base model: the "
                    "teacher's texts are token ids of the base's, and the owner's key reads the base's tokens"
                )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import gc

        from harness.assets import data, models
        from harness.compute.generation import sample_plainly
        from harness.compute.training import save_model
        from harness.store import files

        p = self.params
        tokenizer = models.load_tokenizer(str(model_dir))
        texts = _prompts(tokenizer, self.source(), max(p.texts), p.prompt_tokens, p.new_tokens)
        teacher = models.load_causal_lm(str(model_dir), ctx.device)
        completions = sample_plainly(teacher, texts, p.new_tokens, p.seed, tokenizer.eos_token_id,
                                     "distill: teacher texts")  # fmt: skip
        del teacher
        gc.collect()
        files.write_jsonl(
            out_dir / "teacher_texts.jsonl",
            [{"prompt_ids": a, "completion_ids": b} for a, b in zip(texts, completions, strict=True)],
        )
        student_ref = ctx.base_model if p.student == BASE else (ctx.models or {})["student"]
        trained = {}
        for n in p.texts:
            student = models.load_trainable(str(student_ref), ctx.device)
            if p.lora_rank:
                student = _with_adapters(student, p)
            report = _train(student, tokenizer, texts[:n], completions[:n], p, ctx.device, f"distill: student N={n}")
            if p.lora_rank:
                student = student.merge_and_unload()
            save_model(student, out_dir / student_folder(n), tokenizer)
            trained[n] = report
            del student
            gc.collect()
        return {
            "prompts": {**self.source().model_dump(), "fingerprint": data.fingerprint(self.source())},
            "teacher_texts": len(completions),
            "sampling": "plain sampling at temperature 1 (the harness's per-prompt sampler)",
            "student": p.student,
            "trained": f"LoRA adapters of rank {p.lora_rank}, merged" if p.lora_rank else "every weight",
            "students": {n: student_folder(n) for n in p.texts},
            "training": trained,
            "settings": p.model_dump(),
            "versions": library_versions("accelerate"),
            "evaluated": "each student, trained on its first N teacher texts (float32)",
        }


def student_folder(n: int) -> str:
    return f"students/n-{n}"


def _prompts(tokenizer, source, count: int, prompt_tokens: int, new_tokens: int) -> list[list[int]]:
    """``count`` prompts: the first ``prompt_tokens`` tokens (after BOS where the tokenizer adds one) of the documents
    of ``source`` that hold ``prompt_tokens + new_tokens`` tokens, repeated in order where there are fewer."""
    from harness.assets import data

    docs = data.load_texts(source, limit=2 * count)
    records = data.prompt_records(tokenizer, docs, prompt_tokens, new_tokens, count)
    if not records:
        raise HarnessError(f"distill: no document of '{source.path}' holds {prompt_tokens + new_tokens} tokens")
    return [records[i % len(records)]["prompt_ids"] for i in range(count)]


def _with_adapters(student, p: DistillParams):
    """``student`` with LoRA adapters of rank ``p.lora_rank`` on every projection (peft), drawn from ``p.seed``; only
    they train."""
    import torch
    from peft import LoraConfig, get_peft_model

    from attacks.lora import LLAMA_PROJECTIONS

    config = LoraConfig(r=p.lora_rank, lora_alpha=2 * p.lora_rank, lora_dropout=0.1,
                        target_modules=list(LLAMA_PROJECTIONS), bias="none", task_type="CAUSAL_LM")  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(p.seed)
        return get_peft_model(student, config)


def _train(student, tokenizer, prompts, completions, p: DistillParams, device: str, desc: str) -> dict:
    """Fine-tune ``student`` on ``prompts[i] + completions[i]``, the loss on the completions, for ``p.epochs`` passes
    in an order shuffled by ``p.seed`` per pass, through the fine-tuning attack's batches and loss."""

    from attacks.finetune import example_batches, response_loss, shuffled_passes
    from harness.compute.training import loss_step, train
    from harness.config.settings import TrainSettings

    examples = [(a + b, len(a)) for a, b in zip(prompts, completions, strict=True)]
    steps = max(1, math.ceil(p.epochs * len(examples) / p.batch_size))
    seq_len = max(len(ids) for ids, _ in examples)

    warmup = min(p.warmup_steps / steps, 0.99)
    settings = TrainSettings(
        steps=steps, batch_size=p.batch_size, seq_len=seq_len, lr=p.lr, warmup_frac=warmup, schedule="constant",
        seed=p.seed,
    )  # fmt: skip
    batches = example_batches(shuffled_passes(examples, p.seed), p.batch_size, seq_len, tokenizer)
    report = train(student, loss_step(response_loss), batches, settings, desc, device)
    return {"texts": len(examples), "steps": steps, **{k: v for k, v in report.items() if k != "losses"}}
