"""Full-parameter fine-tuning of the watermarked model on instruction data of another domain (paper appendix "Model
Modification Settings"): OpenMathInstruct-2 and OpenCodeInstruct (and Alpaca), evaluated after s = 300 .. 1,500
steps. One training run writes a checkpoint at every requested step; each checkpoint is its own table row.

Each example is the model's chat template applied to (instruction, response) where the tokenizer has one, else an
Alpaca-style ``### Instruction / ### Response`` text; the loss is on the response tokens only (supervised
fine-tuning as TRL does it for prompt/completion data). The learning rate is constant after an absolute warmup, so
the checkpoint at step s does not depend on which later steps were asked for (a cosine schedule would decay towards
the last one). The harness's own training loop (``harness.compute.training.train``, through accelerate) does the work;
``tune`` below runs it for this attack and for ``lora`` (attacks/lora.py), which trains adapters instead.

Scrubbing (Gloaguen et al.'s adversarial fine-tune): a dataset of plain human text instead of instruction pairs
(``tiny-corpus``, ``small-corpus``, ``c4-realnewslike``, ``openwebtext``, or a local file with ``text_field``) is
language-modelled on every token, each document cut into ``seq_len`` windows. Each named one is the *train* split
of its corpus, disjoint from the documents an evaluation reads (the built-in corpora's held-out split by the rule in
harness/assets/data.py; C4's validation split); and before any work the pipeline refuses any dataset of a plugin
that is the preset's evaluation data itself (harness/cell/checks.py), so no fine-tune sees the human negatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from harness.assets.chat import INSTRUCTION_FORMAT, framing
from harness.config.params import Params
from harness.config.settings import DataSource
from harness.contract.attack import AttackContext, ModelAttack, library_versions
from harness.contract.plugin import Sweep


@dataclass(frozen=True)
class InstructData:
    """A known fine-tuning dataset: where it is, which fields hold the instruction and the response, its table label
    and the shortest response kept (in tokens of the model being fine-tuned). No prompt fields: plain text, the
    response field holding each document, trained on whole (a scrubbing fine-tune)."""

    source: DataSource
    prompt_fields: tuple[str, ...]  # joined by a blank line (Alpaca: instruction, then input when not empty)
    response_field: str
    label: str
    min_response_tokens: int = 0

    @property
    def plain_text(self) -> bool:
        return not self.prompt_fields


DATASETS = {
    # Gloaguen et al. keep OpenMathInstruct-2 responses of at least 200 tokens.
    "openmathinstruct": InstructData(
        DataSource(path="nvidia/OpenMathInstruct-2", split="train", text_field="problem"),
        ("problem",), "generated_solution", "OpenMathInstruct", 200,
    ),
    "opencodeinstruct": InstructData(
        DataSource(path="nvidia/OpenCodeInstruct", split="train", text_field="input"),
        ("input",), "output", "OpenCodeInstruct",
    ),
    "alpaca": InstructData(
        DataSource(path="tatsu-lab/alpaca", split="train", text_field="instruction"),
        ("instruction", "input"), "output", "Alpaca",
    ),
    # The tiny preset's: functions of the Python standard library (tools/make_tiny_code_instruct.py), offline.
    "tiny-code-instruct": InstructData(
        DataSource(path="builtin:tiny-code-instruct", split="train", text_field="prompt"),
        ("prompt",), "response", "StdlibCodeInstruct",
    ),
    # Plain human text of a preset's evaluation domain, for scrubbing: the train split, never the documents that
    # evaluations read (the tiny and smol presets evaluate on tiny-corpus's held-out split, the small preset on
    # small-corpus's, the paper on C4 realnewslike's validation split). OpenWebText: Gloaguen et al.'s adversarial set.
    "tiny-corpus": InstructData(
        DataSource(path="builtin:tiny-corpus", split="train"), (), "text", "TinyCorpus (scrub)"
    ),
    "small-corpus": InstructData(
        DataSource(path="builtin:small-corpus", split="train"), (), "text", "SmallCorpus (scrub)"
    ),
    "c4-realnewslike": InstructData(
        DataSource(path="allenai/c4", name="realnewslike", split="train"), (), "text", "C4 (scrub)"
    ),
    "openwebtext": InstructData(
        DataSource(path="Skylion007/openwebtext", split="train"), (), "text", "OpenWebText (scrub)"
    ),
}  # fmt: skip


class FineTuneParams(Params):
    dataset: str = "openmathinstruct"  # a name in DATASETS, or a local json/jsonl/parquet/csv file or folder
    prompt_field: str = "prompt"  # for a local dataset: the instruction field
    response_field: str = "response"  # for a local dataset: the response field
    text_field: str | None = None  # for a local dataset of plain text (scrubbing): its text field, instead of pairs
    steps: tuple[int, ...] = (300, 600, 900, 1200, 1500)  # checkpoints to evaluate, e.g. steps=300,600
    lr: float = Field(2e-5, gt=0)  # Gloaguen et al.
    batch_size: int = Field(32, gt=0)  # Gloaguen et al.'s effective batch
    seq_len: int = Field(1024, gt=8)  # longer examples are cut at this many tokens
    warmup_steps: int = Field(0, ge=0)
    min_response_tokens: int | None = Field(None, ge=0)  # None: the dataset's (200 for OpenMathInstruct-2)
    seed: int = 0
    added_later = ("text_field",)

    @field_validator("steps", mode="before")
    @classmethod
    def _split_steps(cls, value):
        if isinstance(value, str):
            parts = [p.strip() for p in value.replace(";", ",").split(",") if p.strip()]
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                raise ValueError(
                    f"steps must be whole numbers separated by commas, e.g. 300,600, not {value!r}"
                ) from None
        return value

    @field_validator("steps")
    @classmethod
    def _check_steps(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("give at least one step")
        if any(s <= 0 for s in value):
            raise ValueError(f"steps must be positive, got {','.join(map(str, value))}")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _known_dataset(self) -> FineTuneParams:
        if self.dataset not in DATASETS and not Path(self.dataset).expanduser().exists():
            raise ValueError(
                f"unknown fine-tuning dataset '{self.dataset}': use one of {', '.join(DATASETS)} or a local file"
            )
        if self.warmup_steps >= max(self.steps):
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below the last step ({max(self.steps)})")
        if self.text_field is not None:
            if self.dataset in DATASETS:
                raise ValueError(f"text_field is for a local dataset; '{self.dataset}' names its own fields")
            pair_fields = sorted({"prompt_field", "response_field"} & self.model_fields_set)
            if pair_fields:
                raise ValueError(
                    f"text_field reads plain text, {' and '.join(pair_fields)} instruction pairs: give one or the other"
                )
        return self

    def instruct_data(self) -> InstructData:
        if self.dataset in DATASETS:
            return DATASETS[self.dataset]
        if self.text_field is not None:
            source = DataSource(path=self.dataset, text_field=self.text_field)
            return InstructData(source, (), self.text_field, f"{Path(self.dataset).stem} (scrub)")
        return InstructData(
            DataSource(path=self.dataset, text_field=self.prompt_field), (self.prompt_field,), self.response_field,
            Path(self.dataset).stem,
        )  # fmt: skip


class FineTune(ModelAttack):
    name = "finetune"
    category = "Finetuning"
    label = "Fine-tuning"
    description = "fine-tuning steps s"
    tables = ("robustness", "ft_steps")
    sweep = Sweep("fine-tuning steps", "Fine-tuning on {label}", panels=True)  # x: the step of each checkpoint
    version = "1"
    Params = FineTuneParams
    collective = True  # the paper's 8B student trains across GPUs (FSDP): every process fine-tunes

    @property
    def data(self) -> InstructData:
        return self.params.instruct_data()

    def data_refs(self) -> dict:
        return {"finetune": self.data.source}

    def token_lengths(self) -> dict[str, int]:
        return {"seq_len": self.params.seq_len}

    def table_label(self) -> str:
        return self.data.label  # as the paper's table: the dataset in the Method column, the step in Config

    def config_label(self) -> str:
        return f"s={','.join(map(str, self.params.steps))}"

    def outputs(self) -> list[tuple[str, str]]:
        return [(f"s={s}", checkpoint(s)) for s in self.params.steps]

    def validate(self, base_model: str | None = None) -> None:
        from harness.compute.training import check_split

        check_split(self.params.batch_size, f"the fine-tuning attack's batch_size ({self.params.batch_size})")

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from harness.assets.models import load_tokenizer, load_trainable
        from harness.compute.training import save_model

        tokenizer = load_tokenizer(str(model_dir))
        model = load_trainable(str(model_dir), ctx.device)

        def save(step: int, unwrapped) -> None:  # every process: under FSDP its shards are gathered
            save_model(unwrapped, out_dir / checkpoint(step), tokenizer)

        return tune(model, tokenizer, self.params, self.data, ctx.device, "fine-tune", save,
                    "the fine-tuned model at each requested step (float32 checkpoints)")  # fmt: skip


def tune(
    model,
    tokenizer,
    p: FineTuneParams,
    d: InstructData,
    device: str,
    desc: str,
    on_checkpoint,
    evaluated: str,
    versions: tuple[str, ...] = (),
) -> dict:
    """Train ``model`` (its parameters that require gradients: all of them for ``finetune``, the adapters for ``lora``)
    on the examples of ``d`` as ``p`` says, through the harness's training loop, calling ``on_checkpoint(step,
    unwrapped_model)`` at each step of ``p.steps``; return the attack's report (``evaluated``: what each checkpoint
    holds; ``versions``: libraries besides accelerate and datasets that the attack used)."""
    from harness.assets import data
    from harness.compute.training import loss_step, train
    from harness.config.settings import TrainSettings

    last = max(p.steps)
    settings = TrainSettings(
        steps=last, batch_size=p.batch_size, seq_len=p.seq_len, lr=p.lr, warmup_frac=p.warmup_steps / last,
        schedule="constant", seed=p.seed,
    )  # fmt: skip

    def save(step: int, unwrapped) -> None:
        if step in p.steps:
            on_checkpoint(step, unwrapped)

    stats = {"read": 0, "epochs": 0}
    batches = example_batches(example_stream(tokenizer, d, p, stats), p.batch_size, p.seq_len, tokenizer)
    report = train(model, loss_step(response_loss), batches, settings, desc, device, on_step=save)
    return {
        "dataset": {
            **d.source.model_dump(),
            "fingerprint": data.fingerprint(d.source),
            "label": d.label,
            "prompt_fields": d.prompt_fields,
            "response_field": d.response_field,
        },
        "examples_read": stats["read"],
        "whole_passes": stats["epochs"],
        "format": example_format(tokenizer, d),
        "loss_on": "every token" if d.plain_text else "response tokens",
        "schedule": f"constant after {p.warmup_steps} warmup steps",
        "settings": p.model_dump(),
        "checkpoints": {s: checkpoint(s) for s in p.steps},
        "versions": library_versions("accelerate", "datasets", *versions),
        "evaluated": evaluated,
        **{k: v for k, v in report.items() if k != "losses"},
        "losses": report["losses"],
    }


def response_loss(model, batch):
    """Mean cross-entropy over the trained tokens (labels not -100) of a batch of ``example_batches``. With several
    processes each holds some rows, and its mean over its own tokens would weigh tokens unevenly (rows differ in
    response length): each sums its tokens' losses over the whole batch's count instead (the processes' gradients are
    then averaged, hence the factor)."""
    from harness.compute import distributed

    ids, labels, attention = batch.unbind(1)
    tokens = distributed.total(int((labels[:, 1:] != -100).sum()))  # the model predicts token t from t - 1
    out = model(input_ids=ids, attention_mask=attention, labels=labels, num_items_in_batch=tokens)
    return out.loss * distributed.world_size() if distributed.active() else out.loss


def checkpoint(step: int) -> str:
    return f"checkpoints/step-{step}"


def format_example(tokenizer, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of one example and how many of them are the prompt (not trained on)."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        head = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
        if not full.startswith(head):  # a template that rewrites earlier turns: train on the whole text
            ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            return ids, 0
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        tail_ids = tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"]
        return head_ids + tail_ids, len(head_ids)
    head_ids = tokenizer(INSTRUCTION_FORMAT.format(instruction=prompt), add_special_tokens=False)["input_ids"]
    tail_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    bos, eos = framing(tokenizer)
    return bos + head_ids + tail_ids + eos, len(bos) + len(head_ids)


def text_windows(tokenizer, text: str, seq_len: int) -> list[tuple[list[int], int]]:
    """Examples of one plain-text document, all trained on: its tokens (after BOS, followed by EOS, as
    ``format_example`` frames a response) in windows of ``seq_len`` that overlap by one token, so that every token
    but the first is predicted once, from the tokens before it in its window."""
    bos, eos = framing(tokenizer)
    ids = bos + tokenizer(text, add_special_tokens=False)["input_ids"] + eos
    return [(ids[start : start + seq_len], 0) for start in range(0, max(len(ids) - 1, 1), seq_len - 1)]


def example_format(tokenizer, d: InstructData) -> str:
    """How ``example_stream`` frames the examples of ``d`` for ``tokenizer``, for the attack's report."""
    if d.plain_text:
        return "plain text in windows of seq_len"
    return "chat template" if tokenizer.chat_template else "### Instruction / ### Response"


SHUFFLE_BUFFER = 1024  # examples; a streaming shuffle, so that the first batches never wait for the whole dataset


def example_stream(tokenizer, d: InstructData, p: FineTuneParams, stats: dict):
    """Encoded examples ``(ids, prompt_len)``, endlessly: each epoch reads the dataset in its order through a shuffle
    buffer seeded by ``seed + epoch``. Lazy, so the examples behind step s are the same whatever later steps were
    asked for. Examples whose response is shorter than the minimum or whose instruction fills ``seq_len`` are
    skipped; a plain-text document gives one example per window (``text_windows``). ``stats`` counts the rows read
    and the passes begun."""
    import itertools
    import random

    from harness.assets import data
    from harness.config.errors import HarnessError

    minimum = max(d.min_response_tokens if p.min_response_tokens is None else p.min_response_tokens, 1)
    for epoch in itertools.count():
        rng, buffer, kept = random.Random(p.seed + epoch), [], 0
        stats["epochs"] = epoch + 1
        for row in data.iter_rows(d.source, (*d.prompt_fields, d.response_field)):
            stats["read"] += 1
            for ids, head in encoded(tokenizer, d, row, p.seq_len):
                if len(ids) - head < minimum or head >= p.seq_len:
                    continue
                kept += 1
                buffer.append((ids[: p.seq_len], head))
                if len(buffer) >= SHUFFLE_BUFFER:
                    yield buffer.pop(rng.randrange(len(buffer)))
        if epoch == 0 and kept < p.batch_size:
            raise HarnessError(
                f"fine-tuning dataset '{d.source.path}' has {kept} usable examples of {stats['read']} read, fewer "
                f"than a batch ({p.batch_size}): an example needs a response of at least {minimum} tokens and an "
                f"instruction shorter than seq_len={p.seq_len}"
                if not d.plain_text
                else f"fine-tuning dataset '{d.source.path}' has {kept} windows of at least {minimum} tokens in the "
                f"{stats['read']} documents read, fewer than a batch ({p.batch_size})"
            )
        rng.shuffle(buffer)
        yield from buffer


def encoded(tokenizer, d: InstructData, row: dict, seq_len: int) -> list[tuple[list[int], int]]:
    """The examples ``(ids, prompt_len)`` of one record of ``d``: an instruction pair whole (cut to ``seq_len`` once
    kept), or a plain-text document's windows."""
    if d.plain_text:
        return text_windows(tokenizer, row[d.response_field], seq_len)
    prompt = "\n\n".join(row[f] for f in d.prompt_fields if row[f].strip())
    return [format_example(tokenizer, prompt, row[d.response_field])]


def shuffled_passes(examples: list, seed: int):
    """``examples`` pass after pass without end, each pass in an order shuffled by ``random.Random(seed + pass)``."""
    import random

    epoch = 0
    while True:
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        yield from (examples[i] for i in order)
        epoch += 1


def example_batches(examples, batch_size: int, seq_len: int, tokenizer):
    """``(batch, 3, seq_len)`` tensors (ids, labels with -100 on prompt and padding, attention mask), right-padded,
    from consecutive examples of the stream."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    examples = iter(examples)
    while True:
        batch = torch.zeros((batch_size, 3, seq_len), dtype=torch.long)
        batch[:, 0] = pad
        batch[:, 1] = -100
        for row in range(batch_size):
            ids, head = next(examples)
            batch[row, 0, : len(ids)] = torch.tensor(ids)
            batch[row, 1, head : len(ids)] = torch.tensor(ids[head:])
            batch[row, 2, : len(ids)] = 1
        yield batch
