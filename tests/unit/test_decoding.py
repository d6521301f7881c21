"""Decoding settings (greedy, temperature, top-k, top-p, min-p, repetition penalty) applied by the harness's sampler:
plain sampling keeps every stored hash, greedy is the same text at every batch size, top-k 1 is greedy, top-p 1 is
no top-p, every other setting changes the texts, and bad settings are one line before any work."""

from __future__ import annotations

import csv

import pytest
import torch

from harness.compute.generation import GumbelPerPrompt, sample
from harness.config.errors import HarnessError
from harness.config.presets import TINY
from harness.config.settings import EvalSettings, apply_overrides, decode_overrides

# EvalSettings' fields before decoding settings existed: a plain run's specs hold exactly these, so no hash moves.
PLAIN_EVAL = {"num_prompts", "prompt_tokens", "new_tokens", "temperature", "seed", "batch_size", "ppl_batch_size",
              "score_on"}  # fmt: skip
DECODINGS = [
    {"greedy": "true"},
    {"temperature": "0.7"},
    {"temperature": "1.3"},
    {"top_p": "0.9"},
    {"top_k": "50"},
    {"min_p": "0.05"},
    {"repetition_penalty": "1.2"},
]


def decoded(**items: str) -> EvalSettings:
    return apply_overrides(TINY, decode_overrides(items)).eval


def test_plain_sampling_is_recorded_as_it_always_was():
    assert set(TINY.eval.model_dump()) == PLAIN_EVAL
    neutral = decoded(greedy="false", top_k="0", top_p="1", min_p="0", repetition_penalty="1", temperature="1")
    assert neutral == TINY.eval and neutral.model_dump() == TINY.eval.model_dump()
    assert neutral.decoding_label() == "" and neutral.decoding() == {}
    top_p = decoded(top_p="0.9", temperature="0.7")
    assert top_p.model_dump()["top_p"] == 0.9 and top_p.decoding_label() == "temperature=0.7, top_p=0.9"
    assert top_p.plain() == TINY.eval


@pytest.mark.parametrize(
    ("items", "says"),
    [
        ({"temperature": "0"}, "greater than 0"),
        ({"temperature": "-0.5"}, "greater than 0"),
        ({"temperature": "nan"}, "finite"),
        ({"temperature": "inf"}, "finite"),
        ({"temperature": "1e-30"}, "below 2^-64"),
        ({"top_p": "0"}, "greater than 0"),
        ({"top_p": "1.01"}, "less than or equal to 1"),
        ({"top_p": "nan"}, "finite"),
        ({"top_k": "-1"}, "greater than or equal to 0"),
        ({"top_k": "2.5"}, "integer"),
        ({"min_p": "1"}, "less than 1"),
        ({"min_p": "-0.1"}, "greater than or equal to 0"),
        ({"repetition_penalty": "0"}, "greater than 0"),
        ({"repetition_penalty": "-1.2"}, "greater than 0"),
        ({"greedy": "maybe"}, "boolean"),
        ({"greedy": "true", "temperature": "0.7"}, "greedy decoding takes the likeliest token"),
        ({"greedy": "true", "top_p": "0.9"}, "greedy decoding takes the likeliest token"),
        ({"beams": "4"}, "unknown decoding setting 'beams'"),
        ({"seed": "3"}, "unknown decoding setting 'seed'"),
    ],
)
def test_bad_decoding_settings_are_one_line(items, says):
    with pytest.raises(HarnessError) as err:
        decoded(**items)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def peaky(llama_builder, tmp_path_factory):
    """A random Llama whose next-token distributions are far from uniform (large weights), so that truncating them
    changes what is drawn."""
    from harness.assets.models import load_causal_lm

    folder = llama_builder(tmp_path_factory.mktemp("peaky") / "m", 3, initializer_range=0.5)
    return load_causal_lm(str(folder), "cpu", dtype="float32")


def texts(model, batch: int = 8, **items: str) -> list[list[int]]:
    settings = decoded(**items).model_copy(update={"new_tokens": 12, "batch_size": batch})
    prompts = torch.randint(3, model.config.vocab_size, (8, 4), generator=torch.Generator().manual_seed(0)).tolist()
    return sample(model, prompts, settings, None, "test")


def test_greedy_is_the_same_text_at_every_batch_size_and_is_top_k_1(peaky):
    greedy = texts(peaky, greedy="true")
    assert all(texts(peaky, batch, greedy="true") == greedy for batch in (1, 3, 5))
    assert texts(peaky, top_k="1") == greedy
    assert texts(peaky, top_k="1", temperature="0.5") == greedy  # (one token left: the temperature cannot move it)
    # greedy is the argmax at every step, as a loop over the model's own logits gives it
    prompts = torch.randint(3, peaky.config.vocab_size, (8, 4), generator=torch.Generator().manual_seed(0))
    seqs = prompts
    with torch.no_grad():
        for _ in range(12):
            seqs = torch.cat([seqs, peaky(seqs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert seqs[:, 4:].tolist() == greedy


def test_top_p_1_is_plain_sampling_and_every_other_setting_changes_the_texts(peaky):
    plain = texts(peaky)
    assert texts(peaky, top_p="1") == plain and texts(peaky, batch=3) == plain
    for items in DECODINGS:
        assert texts(peaky, **items) != plain, items


def test_the_transforms_run_in_a_users_order_after_the_watermark():
    """Penalty on the raw scores, then temperature, then the truncations: a token top-k drops is at -inf whatever the
    noise; greedy returns the penalised scores with no noise."""
    scores = torch.tensor([[4.0, 3.0, 2.5, -1.0, 1.0]])
    ids = torch.tensor([[0, 3]])  # tokens 0 and 3 already written: the penalty divides 4.0, multiplies -1.0
    greedy = GumbelPerPrompt(0, torch.arange(1), 1, 1.0, {"greedy": True, "repetition_penalty": 2.0})(ids, scores)
    assert greedy.tolist() == [[2.0, 3.0, 2.5, -2.0, 1.0]]  # (token 1 is now the likeliest)
    top2 = GumbelPerPrompt(0, torch.arange(1), 1, 0.5, {"top_k": 2, "repetition_penalty": 2.0})(ids, scores)
    assert torch.isfinite(top2).tolist() == [[False, True, True, False, False]]
    # min-p at temperature 0.5 (scores 4, 6, 5, -4, 2): token 2 has e^-1 of the likeliest's probability, token 0 e^-2
    minp = GumbelPerPrompt(0, torch.arange(1), 1, 0.5, {"min_p": 0.2, "repetition_penalty": 2.0})(ids, scores)
    assert torch.isfinite(minp).tolist() == [[False, True, True, False, False]]
    # and the noise on what is left is the plain sampler's at that temperature
    plain = GumbelPerPrompt(0, torch.arange(1), 1, 0.5)(ids, torch.tensor([[2.0, 3.0, 2.5, -2.0, 1.0]]))
    assert torch.equal(minp[0, 1:3], plain[0, 1:3])


def test_the_repetition_penalty_acts_before_a_watermarks_processor_and_the_rest_after(peaky):
    """The stack users run with transformers: its built-in repetition penalty, then the processors they pass
    (lm-watermarking's and MarkLLM's KGW), then temperature and truncation. A processor that records what it is given
    sees the penalised logits at every step, and what it returns is what temperature and top-k act on."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from harness.compute.generation import draw

    seen = []

    class Recorder:
        def __call__(self, input_ids, scores):
            seen.append((input_ids.clone(), scores.clone()))
            return scores

    ids = torch.randint(3, peaky.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1))
    out = draw(peaky, ids, torch.arange(2), 0, 0.7, 3, 0, (Recorder(),), {"repetition_penalty": 1.5, "top_k": 4})
    penalty = RepetitionPenaltyLogitsProcessor(1.5)
    with torch.no_grad():
        for step, (prefix, scores) in enumerate(seen):
            expected = penalty(prefix, peaky(prefix).logits[:, -1].float())
            kept = torch.isfinite(scores)  # (transformers' own min_new_tokens masks the EOS id before any processor)
            assert (~kept).sum(-1).tolist() == [1, 1] and torch.isinf(scores[~kept]).all(), step
            # (the sampler's cached forward against a fresh one: float32 sums in another order)
            assert torch.allclose(scores[kept], expected[kept], rtol=1e-5, atol=1e-5), step
            assert torch.equal(prefix, out[:, : 4 + step])
    assert len(seen) == 3


@pytest.mark.parametrize("items", [{"greedy": "true"}, {"temperature": "0.7"}, {"top_k": "5"}, {"top_p": "0.9"},
                                   {"min_p": "0.1"}, {"temperature": "0.7", "top_p": "0.9"}])  # fmt: skip
@pytest.mark.parametrize("method", ["kth-decoding", "aar-decoding"])
def test_a_decoding_a_method_that_chooses_its_own_token_ignores_is_refused(method, items, cli):
    """KTH and AAR decoding pick each token from their key: a row labelled greedy or top-p would be plain
    sampling's again. One line, before any work; the repetition penalty, which acts before them, is taken."""
    decode = [arg for k, v in items.items() for arg in ("--decode", f"{k}={v}")]
    out = cli("run", "--method", method, *decode, "--dry-run")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{method} chooses each token itself" in out.stderr and next(iter(items)) in out.stderr
    assert cli("run", "--method", method, "--decode", "repetition_penalty=1.2", "--dry-run").returncode == 0


@pytest.mark.parametrize("k, refused", [(4095, False), (4096, True), (100_000, True)])
def test_a_top_k_that_keeps_the_whole_vocabulary_is_refused(k, refused, cli):
    """The tiny base's tokenizer has 4,096 tokens: a top-k at or above that truncates nothing, so its rows would be
    plain sampling's under another label (and other hashes). One line, before any work, judged by the recipe."""
    out = cli("run", "--method", "gu-kgw", "--decode", f"top_k={k}", "--dry-run")
    if refused:
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"eval.top_k={k} keeps every token of the base model's 4,096-token vocabulary" in out.stderr
    else:
        assert out.returncode == 0, out.stderr


def test_a_grid_group_decodes_each_way_and_refuses_a_bad_one(tmp_path):
    from harness.grid import spec as grid

    path = tmp_path / "g.yaml"
    path.write_text(
        "preset: tiny\ngroups:\n  g:\n    methods: {gu-kgw: [{}]}\n    attacks: {none: [{}], slerp: [{t: 0.5}]}\n"
        "    decodings: [{}, {top_p: 0.9}, {greedy: true}]\n"
    )
    cells = grid.load(path).cells
    assert len(cells) == 6
    assert sorted({c.preset.eval.decoding_label() for c in cells}) == ["", "greedy", "top_p=0.9"]
    assert len({c.training for c in cells}) == 1  # one training for every decoding
    path.write_text(path.read_text().replace("{greedy: true}", "{top_p: 2}"))
    with pytest.raises(HarnessError, match=r"g.yaml:6: .*top_p"):
        grid.load(path)


def test_decoded_runs_share_the_setup_and_only_the_decoding_table_reads_them(tmp_path, fake_run):
    from harness.report import collect, tables
    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    top_p = TINY.model_copy(update={"eval": decoded(top_p="0.9")})
    unaltered = {}
    for preset, auc in ((TINY, 0.9), (top_p, 0.7)):
        for method in ("gu-kgw", "pro"):
            fake_run(store, method, {}, "base", {}, 0.5, preset=preset)
            unaltered[method, auc] = fake_run(store, method, {}, "none", {}, auc, preset=preset).name
    # the same prompts and human texts: a decoded run pairs with the plain one (benchmarks/paired.py), another
    # evaluation does not
    _, on = collect.paired_scores(store, [unaltered["pro", 0.7]], [unaltered["pro", 0.9]])
    assert on == "evaluation spec"
    pairs = Store(tmp_path / "pairs")
    other = TINY.model_copy(update={"eval": TINY.eval.model_copy(update={"prompt_tokens": 16})})
    runs = [fake_run(pairs, "pro", {}, "none", {}, 0.9, preset=p).name for p in (top_p, other)]
    with pytest.raises(ValueError, match="different"):
        collect.paired_scores(pairs, runs[:1], runs[1:])
    df = collect.collect(store)
    assert df["setup"].nunique() == 1 and sorted(df["decoding"].unique()) == ["", "top_p=0.9"]
    written = tables.write_tables(df, tmp_path / "tables")
    folder = tmp_path / "tables" / "tiny"
    decoding = (folder / "decoding.csv").read_text()
    assert "temperature=1" in decoding and "top_p=0.9" in decoding, decoding
    assert "top_p" not in (folder / "robustness.csv").read_text()  # the robustness table: plain sampling's runs
    assert "decoding" in (tmp_path / "tables" / "runs.csv").read_text().splitlines()[0]
    assert folder / "decoding.tex" in written
    # with the store, each decoded cell's change from plain sampling and its paired interval (fake AUCs 0.7 and 0.9)
    tables.write_tables(df, tmp_path / "paired", store=store)
    with open(tmp_path / "paired" / "tiny" / "decoding.csv", newline="") as fh:
        rows = {(r["decoding"], r["attack"]): r for r in csv.DictReader(fh)}
    change = rows[("top_p=0.9", "")]
    for method in ("Gu-KGW", "PRO"):
        d, lo, hi = (float(change[f"{method} {k}"]) for k in ("dAUC", "dAUC_lo", "dAUC_hi"))
        assert lo <= d <= hi and -0.4 < d < 0, (method, d, lo, hi)
    assert rows[("temperature=1", "")]["PRO dAUC"] == "missing"  # (plain sampling is what the others change from)
    plain = Store(tmp_path / "plain")
    fake_run(plain, "gu-kgw", {}, "none", {}, 0.9)
    tables.write_tables(collect.collect(plain), tmp_path / "plain-tables")
    assert "decoding" not in (tmp_path / "plain-tables" / "runs.csv").read_text().splitlines()[0]
    assert not (tmp_path / "plain-tables" / "tiny" / "decoding.csv").exists()
