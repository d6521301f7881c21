"""The plugin contract, the one floor methods/ and attacks/ build on: what a plugin declares (``plugin.py``), the
method and detector interfaces with what training is given (``method.py``), the attack interfaces (``attack.py``) and
what an attack may ask of the pipeline that runs it (``pipeline.py``). Nothing here imports a method or an attack, or
a floor above it; methods/ and attacks/ import only this floor and those below it (tests/unit/test_layout.py)."""
