"""Attacks in a chain (attacks/chain.py) on small random models: each link a stage keyed by the one before, shared
with the attack run alone and with other chains of the same prefix, reused on a re-run; a text attack may end a
chain; rows name the whole chain; bad chains are one line before any work."""

import json

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.presets import TINY
from harness.config.registry import attacks, methods
from harness.store.stages import Store

SMALL = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "6",
         "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "3"}  # fmt: skip


def chain(*links, preset=None):
    return attacks.build("chain", {"links": [{"attack": a, "settings": s} for a, s in links]}, preset)


def attack_stages(root):
    return {p.name for p in (root / "stages" / "attack").iterdir()}


def test_a_chain_reuses_every_link_and_shares_its_prefix(random_llamas, small_preset, tmp_path):
    _, base = random_llamas
    preset = small_preset(tmp_path, base, **SMALL)
    store = Store(tmp_path / "runs")
    method = methods.build("gu-kgw", {"k": "1"})
    alone = Pipeline(preset, store, "cpu").run(method, attacks.build("weight-noise", {"sigma": "0.05"}))
    first = attack_stages(tmp_path / "runs")
    two = chain(("weight-noise", {"sigma": 0.05}), ("slerp", {"t": 0.3}))
    cells = Pipeline(preset, store, "cpu").run(method, two)
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "Weight noise → SLERP sigma=0.05 → t=0.3"]
    after = attack_stages(tmp_path / "runs")
    assert first < after and len(after - first) == 1  # the noise link is the noise attack's own stage
    spec = json.loads((cells[2].run.path / "spec.json").read_text())
    assert spec["config"]["attack"]["category"] == "Chains"
    assert [link["attack"] for link in spec["config"]["attack"]["params"]["links"]] == ["weight-noise", "slerp"]
    slerp = json.loads((tmp_path / "runs" / "stages" / "attack" / (after - first).pop() / "spec.json").read_text())
    noise_key = alone[2].run.path  # the noise run's model is the input of the chain's second link
    assert slerp["input"] in json.loads((noise_key / "spec.json").read_text())["upstream"]["generate"]["model"]
    again = Pipeline(preset, store, "cpu").run(method, two)
    assert all(c.reused for c in again) and attack_stages(tmp_path / "runs") == after
    three = chain(("weight-noise", {"sigma": 0.05}), ("slerp", {"t": 0.3}), ("typo", {"p": 0.2}))
    ended = Pipeline(preset, store, "cpu").run(method, three)
    assert ended[2].row == "Weight noise → SLERP → Typos sigma=0.05 → t=0.3 → p=0.2"
    assert attack_stages(tmp_path / "runs") == after  # the text attack reused both model links
    gens = [json.loads(line) for line in (ended[2].run.path / "generations.jsonl").read_text().splitlines()]
    model_gens = [json.loads(line) for line in (cells[2].run.path / "generations.jsonl").read_text().splitlines()]
    assert [g["original_completion"] for g in gens] == [g["completion"] for g in model_gens]


def test_a_link_with_several_outputs_hands_each_on(random_llamas, small_preset, tmp_path):
    _, base = random_llamas
    corpus = tmp_path / "instruct.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": f"Say {i}.", "response": f"{i} " * 6}) + "\n" for i in range(40)))
    preset = small_preset(tmp_path, base, **SMALL)
    tuned = {"dataset": str(corpus), "steps": "1,2", "batch_size": 2, "seq_len": 16}
    rows = Pipeline(preset, Store(tmp_path / "runs"), "cpu", plan=True).run(
        methods.build("gu-kgw", {"k": "1"}), chain(("finetune", tuned), ("slerp", {"t": 0.5}))
    )
    assert [c.row for c in rows][2:] == ["instruct → SLERP s=1 → t=0.5", "instruct → SLERP s=2 → t=0.5"]


@pytest.mark.parametrize(
    "links, message",
    [
        ([("typo", {}), ("slerp", {})], "a text attack may only end a chain"),
        ([("dipper", {}), ("gptq", {})], "a text attack may only end a chain"),
        ([("slerp", {})], "2 to 4 links, not 1"),
        ([("slerp", {})] * 5, "2 to 4 links, not 5"),
        ([("slerp", {}), ("none", {})], "link 2 cannot be 'none'"),
        ([("chain", {}), ("slerp", {})], "link 1 cannot be 'chain'"),
        ([("slerp", {"t": 2}), ("gptq", {})], "link 1: bad settings for attack 'slerp'"),
        ([("slerp", {}), ("weight-noise", {"sigma": -1})], "link 2: bad settings for attack 'weight-noise'"),
        ([("slerp", {}), ("nonsense", {})], "link 2: unknown attack 'nonsense'"),
    ],
)
def test_bad_chains_are_one_line(links, message):
    with pytest.raises(HarnessError, match=message) as err:
        chain(*links, preset=TINY)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--attack", "typo", "--then", "slerp"],
        ["--attack", "slerp", "--then-arg", "t=1"],
        ["--attack", "slerp", "--then", "gptq", "--then-arg", "bits=9"],
        ["--attack", "slerp", "--then", "slerp", "--then-arg", "t=0.5", "--then-arg", "t=0.6"],
        ["--attack", "slerp", "--then", "slerp", "--then-arg", "t"],
        ["--attack", "slerp", *["--then", "slerp"] * 4],
        ["--attack", "chain"],
        ["--attack", "chain", "--attack-arg", 'links=[{"attack": "typo"}]'],
    ],
)
def test_the_cli_refuses_bad_chains_before_any_work(cli, tmp_path, args):
    out = cli("run", "--method", "gu-kgw", *args, "--dry-run", "--results", str(tmp_path / "runs"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "runs").exists()
    if args[1] == "chain":  # pydantic's own message names the setting, and the line says how to spell a chain
        assert "links: " in out.stderr and "--then" in out.stderr, out.stderr


def test_the_cli_spells_a_chain_with_then(cli, tmp_path):
    out = cli("run", "--method", "gu-kgw", "--attack", "finetune", "--attack-arg", "steps=9", "--then", "slerp",
              "--then-arg", "t=0.5", "--then", "gguf", "--then-arg", "type=Q4_0", "--dry-run",
              "--results", str(tmp_path / "runs"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    # (the cells' labels are listed only once the tiny LM is built; the first line names the chain either way)
    assert "gu-kgw x StdlibCodeInstruct → SLERP → GGUF on preset 'tiny'" in out.stdout, out.stdout
    three = chain(("finetune", {"steps": "9"}), ("slerp", {"t": 0.5}), ("gguf", {"type": "Q4_0"}), preset=TINY)
    assert three.config_label() == "s=9 → t=0.5 → Q4_0"
    # the links take the preset's settings for their attacks, as each alone would
    resolved = chain(("finetune", {"steps": "9"}), ("slerp", {"t": 0.5}), preset=TINY)
    assert resolved.links[0].params == attacks.build("finetune", {"steps": "9"}, TINY).params
