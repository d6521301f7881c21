"""``harness detect`` on the tiny preset, in the smoke tests' shared store: the Gu-KGW student and its SLERP and INT8
derivatives are found from 64 texts, the unwatermarked base is not, and texts from a file get the scores the run gave
them. (Another method's key on these models: ``test_tiny_pro.py``.) The cells it reads are asked for here; where
another test's process (``test_tiny_pipeline.py``, ``test_tiny_attacks.py``' grid) computed them, they are reused."""

import json

import pytest

pytestmark = pytest.mark.smoke


@pytest.fixture(scope="module")
def stored(shared_store, harness, runs_by_row):
    root = shared_store
    out = harness("run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=0.5", "--results", str(root),
                  timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = runs_by_row(root, "slerp")
    key = rows["Unaltered"][0]["detector"]["key_from"]
    return root, key, rows


def detect(cli, root, *args):
    out = cli("detect", "--results", str(root), "--num-texts", "64", "--json", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def attacked_model(root, attack):
    """The evaluated model folder of the stored ``attack`` stage in ``root``."""
    return next(
        p.parent / "model"
        for p in (root / "stages" / "attack").glob("*/spec.json")
        if json.loads(p.read_text())["attack"] == attack
    )


def test_the_student_and_its_derivatives_are_found_and_the_base_is_not(stored, cli):
    root, key, rows = stored
    out = cli("run", "--method", "gu-kgw", "--attack", "int8", "--results", str(root))
    assert out.returncode == 0, out.stderr[-3000:]  # the INT8 cell (reused where test_tiny_attacks' grid made it)
    found = {
        "student": detect(cli, root, "--key", key, "--model", str(root / "stages" / "train" / key / "model")),
        "slerp": detect(cli, root, "--key", key[:8], "--model", str(attacked_model(root, "slerp"))),
        "int8": detect(cli, root, "--key", key, "--model", str(attacked_model(root, "int8"))),
        "base": detect(cli, root, "--method", "gu-kgw", "--model", "builtin:tiny-lm"),
    }
    for name in ("student", "slerp", "int8"):
        d = found[name]["decision"]
        assert d["p_value"] < 1e-3 and d["watermarked"] and d["texts"] == 64, (name, d)
    d = found["base"]["decision"]
    assert d["p_value"] > 0.05 and not d["watermarked"], d
    # The base model as the suspect writes the base's own texts: the quality gate's reading is the identity.
    quality = found["base"]["quality"]
    assert quality["ppl_ratio"] == 1.0 and quality["rep3"] == quality["base_rep3"] and quality["verdict"] == "ok"
    assert all(found[name]["quality"]["judge"].startswith("builtin:tiny-lm (the key's base") for name in found)
    assert found["base"]["key"]["train_stage"] == key  # --method found the same training


def test_texts_from_a_file_get_the_scores_of_their_run(stored, cli, tmp_path):
    root, key, rows = stored
    run = next(
        p.parent for p in root.glob("*/DONE") if json.loads((p.parent / "spec.json").read_text())["row"] == "Unaltered"
    )
    scored = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    gens = {g["i"]: g for g in map(json.loads, (run / "generations.jsonl").read_text().splitlines())}
    generated = [s for s in scored if s["label"] == 1][:40]
    file = tmp_path / "texts.jsonl"
    file.write_text("".join(json.dumps({"text": gens[s["i"]]["completion"]}) + "\n" for s in generated))
    report = detect(cli, root, "--key", key, "--texts", str(file))
    assert [t["score"] for t in report["texts"]] == pytest.approx([s["score"] for s in generated], abs=1e-9)
    assert [t["p_value"] for t in report["texts"]] == pytest.approx([s["p_value"] for s in generated], abs=1e-12)
    assert report["decision"]["watermarked"] and report["decision"]["texts"] == 40
