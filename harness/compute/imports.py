"""A faster start for every harness process: transformers without hqq's start-up cost.

transformers imports ``hqq`` as it starts whenever hqq is installed (the ``quant`` extra installs it), for one class
the harness never uses (``HQQQuantizedCache``, an HQQ-quantized KV cache). hqq's class bodies call ``torch.compile``,
which imports most of ``torch._dynamo``: about 2 s of the 10 s that importing the stack takes on 2 cores, paid by
every ``harness`` command that loads a model (measured: 5.4-6.3 s against 7.5-7.7 s for transformers' generation
and sklearn after torch). ``defer_hqq_import`` makes transformers' cache module skip that import as it loads and
leaves its HQQ cache working: the quantizer it names is fetched from hqq on first use. The HQQ attack imports hqq
itself when it runs. Written by hand because transformers has no setting for it; if transformers changes the names
this relies on, nothing is deferred and nothing breaks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

CACHE_MODULE = "transformers.cache_utils"


class _LazyHQQQuantizer:
    """Stands for ``hqq.core.quantize.Quantizer`` in transformers' cache module; imports it on first use."""

    def __getattr__(self, name: str):
        from hqq.core.quantize import Quantizer

        return getattr(Quantizer, name)


class _DeferHQQ(importlib.abc.MetaPathFinder):
    """Finds transformers' cache module as Python would, and runs it with ``is_hqq_available`` false."""

    def find_spec(self, name, path=None, target=None):
        if name != CACHE_MODULE:
            return None
        sys.meta_path.remove(self)  # one module, once
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        utils = sys.modules.get("transformers.utils")
        original = getattr(utils, "is_hqq_available", None)
        if spec is None or spec.loader is None or original is None or not original():
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            utils.is_hqq_available = lambda *args, **kwargs: False
            try:
                run(module)
            finally:
                utils.is_hqq_available = original
            module.is_hqq_available = original
            module.HQQQuantizer = _LazyHQQQuantizer()

        spec.loader.exec_module = exec_module
        return spec


def defer_hqq_import() -> None:
    """Install the finder above, unless transformers' cache module is already imported (then it is too late)."""
    if CACHE_MODULE not in sys.modules and not any(isinstance(f, _DeferHQQ) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferHQQ())
