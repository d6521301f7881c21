"""docs/plugins.md, the plugin author's page, shows code that runs: each of its Python blocks is, byte for byte, part
of tests/smoke/outside/outside_plugins.py (which tests/smoke/test_outside_plugins.py installs through entry points
and runs through every command), its pyproject.toml registers exactly what that test registers, and it shows a
method, a model attack, a text attack and an attack of a kind of its own."""

import ast
import configparser
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "plugins.md"
MODULE = ROOT / "tests" / "smoke" / "outside" / "outside_plugins.py"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


def test_every_python_block_of_the_page_is_the_smoke_tested_module():
    module = MODULE.read_text()
    blocks = _blocks("python")
    assert len(blocks) >= 5
    for block in blocks:
        assert block in module, f"docs/plugins.md shows code that is not in {MODULE.name}:\n{block[:300]}"


def test_the_page_registers_what_the_smoke_test_installs():
    (toml,) = _blocks("toml")
    shown = tomllib.loads(toml)["project"]["entry-points"]
    source = (ROOT / "tests" / "smoke" / "test_outside_plugins.py").read_text()
    installed = configparser.ConfigParser(delimiters="=")
    installed.read_string(re.search(r'ENTRY_POINTS = """\\\n(.*?)"""', source, re.S).group(1))
    assert shown == {group: dict(installed[group]) for group in installed.sections()}


def test_the_page_shows_a_plugin_of_every_kind():
    bases = {
        base.id
        for block in _blocks("python")
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name)
    }
    assert {"WatermarkMethod", "Detector", "ModelAttack", "TextAttack", "Attack"} <= bases, bases


def test_the_page_copied_block_after_block_is_a_module_of_every_plugin_it_registers():
    """What a reader who copies the page's blocks in order into ``outside_plugins.py`` gets: a module that defines
    each class its pyproject.toml registers, of the kind its group says."""
    import types

    from harness.contract.attack import Attack
    from harness.contract.method import WatermarkMethod

    module = types.ModuleType("outside_plugins_from_the_page")
    exec(compile("\n\n\n".join(_blocks("python")), "outside_plugins.py", "exec"), module.__dict__)  # noqa: S102
    (toml,) = _blocks("toml")
    kinds = {"harness.methods": WatermarkMethod, "harness.attacks": Attack}
    for group, entries in tomllib.loads(toml)["project"]["entry-points"].items():
        for name, target in entries.items():
            cls = getattr(module, target.split(":")[1])
            assert issubclass(cls, kinds[group]) and cls.name == name, (group, name, target)
            cls(cls.Params())  # its settings' defaults build
