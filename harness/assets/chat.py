"""Chat prompts: an instruction rendered as a user sends it to an open model (``harness run --prompts chat``), and
the bundled instruction set it is drawn from.

A model with a chat template gets the instruction through it (with the system prompt as a ``system`` turn where one
is given); the harness's own models (the tiny and small LMs and their donors), which have none, get the instruction
format the fine-tuning attack writes (attacks/finetune.py). Any other model without a chat template is refused: its
makers never said how it takes an instruction.

``builtin:tiny-chat`` asks about each document of ``builtin:tiny-corpus`` (a help topic, a module, a function) and
answers with the document itself, human-written documentation, on the corpus's own train and held-out split: its
held-out answers are the documents that ``--prompts documents`` continues, so both modes score human text of one
source.
"""

from __future__ import annotations

from harness.assets import models
from harness.config.errors import HarnessError, first_line
from harness.config.refs import TINY_LM

# The format the fine-tuning attack trains on where a tokenizer has no chat template (attacks/finetune.py), and the
# system prompt as a section before it.
INSTRUCTION_FORMAT = "### Instruction:\n{instruction}\n\n### Response:\n"
SYSTEM_FORMAT = "### System:\n{system}\n\n"
# Models the harness builds: no chat template, the instruction format theirs (the fine-tuning attack teaches it).
INSTRUCTION_FORMAT_MODELS = frozenset(
    {TINY_LM, "builtin:small-lm", *(f"builtin:{b}-donor-{f}" for b in ("tiny", "small") for f in ("code", "prose"))}
)
TINY_CHAT_VERSION = "1"  # how tiny-chat's instructions are worded: part of its fingerprint


def chat_format(tokenizer, ref: str) -> str:
    """``"template"`` (the tokenizer's chat template) or ``"instruction"`` (``INSTRUCTION_FORMAT``) for the model
    ``ref``; one line for a model with neither."""
    if getattr(tokenizer, "chat_template", None):
        return "template"
    if ref in INSTRUCTION_FORMAT_MODELS:
        return "instruction"
    raise HarnessError(
        f"chat prompts: the model '{ref}' has no chat template and no instruction format of the harness's own "
        "models: evaluate it on --prompts documents (or code), or give it a tokenizer with a chat template"
    )


def check(ref: str, system: str | None, new_tokens: int) -> None:
    """Before any work: the model ``ref`` takes chat prompts (``chat_format``), and ``system`` leaves room for
    ``new_tokens`` in its context (``check_system``). Reads its tokenizer (building a built-in model first)."""
    tokenizer = models.load_tokenizer(models.resolve(ref))
    render(tokenizer, ref, "An instruction.", system)  # (a template that refuses the conversation: one line, now)
    check_system(tokenizer, ref, system, new_tokens, models.context_length(ref))


def check_system(tokenizer, ref: str, system: str | None, new_tokens: int, context: int | None) -> None:
    """One line where the system prompt alone, rendered for the model, leaves no room for ``new_tokens`` in its
    ``context``."""
    if context is not None and system is not None:
        alone = len(render(tokenizer, ref, "", system))
        if alone + new_tokens > context:
            raise HarnessError(
                f"the system prompt takes {alone} tokens with the chat format: with {new_tokens} new tokens it "
                f"exceeds the {context} tokens the base model takes (its max_position_embeddings); shorten it"
            )


def render(tokenizer, ref: str, instruction: str, system: str | None = None) -> list[int]:
    """The token ids a user's stack sends for ``instruction`` (after ``system`` where given), up to where the
    model's answer begins: the chat template with its generation prompt, or BOS and the instruction format."""
    if chat_format(tokenizer, ref) == "template":
        from jinja2 import TemplateError

        messages = [{"role": "system", "content": system}] if system else []
        try:
            text = tokenizer.apply_chat_template(
                [*messages, {"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True
            )
        except TemplateError as err:  # (it raised, or reached outside the sandbox transformers renders it in)
            hint = (
                " (a template that takes no system turn, as Gemma's and Mistral's: drop --system-prompt)"
                if system
                else ""
            )
            raise HarnessError(
                f"the chat template of '{ref}' refuses the conversation: {type(err).__name__}: {first_line(err)}{hint}"
            ) from None
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = (SYSTEM_FORMAT.format(system=system) if system else "") + INSTRUCTION_FORMAT.format(instruction=instruction)
    return framing(tokenizer)[0] + tokenizer(text, add_special_tokens=False)["input_ids"]


def framing(tokenizer) -> tuple[list[int], list[int]]:
    """The ids before and after an example in the instruction format: BOS (where the tokenizer has one that is not
    its EOS) and EOS, as the fine-tuning attack frames what it trains on."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and tokenizer.bos_token_id not in eos else []
    return bos, eos


def tiny_chat_record(row: dict) -> dict:
    """A ``builtin:tiny-chat`` record of a ``builtin:tiny-corpus`` one: an instruction asking for what the document
    explains, and the document as the answer (a help page's title and underline dropped: an answer does not start
    with a heading)."""
    source, text = row["source"], row["text"].strip()
    kind, _, name = source.partition(":")
    if kind == "pydoc":
        instruction = f'Explain the Python help topic "{name}".'
        lines = text.split("\n")
        if len(lines) > 2 and lines[1] and set(lines[1]) <= set("*=-"):
            text = "\n".join(lines[2:]).strip()
    else:
        module = kind.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        what = f"the module `{module}`" if name == "<module>" else f"`{name}` in the module `{module}`"
        instruction = f"Explain {what} of Python's standard library."
    return {"source": source, "prompt": instruction, "response": text}
