"""transformers starts without importing hqq in a harness process (harness/compute/imports.py), and its HQQ cache
still reaches hqq's quantizer."""

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from harness.compute.imports import defer_hqq_import
defer_hqq_import()
import transformers.generation.utils
import transformers.cache_utils as cache_utils
assert "hqq" not in sys.modules, "hqq was imported"
assert cache_utils.is_hqq_available()
from hqq.core.quantize import Quantizer
assert cache_utils.HQQQuantizer.quantize == Quantizer.quantize and "hqq" in sys.modules
print("ok")
"""


def test_transformers_starts_without_hqq_and_its_hqq_cache_still_finds_it():
    pytest.importorskip("hqq")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
