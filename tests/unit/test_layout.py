"""The shape of the repository that the next contributor relies on: each floor of harness/ imports only its own floor
and those below it (``FLOORS``, the order docs/development.md states); methods/ and attacks/ are leaves on the contract
floor (they import ``harness.contract`` and the floors below it, nothing in harness/ imports them: the registry names
them as ``module:Class`` strings); the import picture of all three has no circle (imports inside functions included);
and the report names no method or attack (their labels, categories and tables come from the plugins)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("methods", "attacks")
# The floors of harness/, lowest first, in the order data flows through them: a module imports only modules of its own
# floor or of a floor below it. docs/development.md's layout section states this order;
# ``test_the_readme_states_the_floor_order`` holds the two together.
FLOORS = ("config", "compute", "store", "assets", "contract", "cell", "audit", "grid", "report", "cli")
PLUGIN_FLOOR = "contract"  # the highest floor a method or an attack may import
ENTRY_POINTS = {"harness", "harness.__main__"}  # the package itself and ``python -m harness``: above every floor


def _modules(*packages: str) -> dict[str, Path]:
    found = {}
    for file in sorted(f for package in packages or ("harness",) for f in (ROOT / package).rglob("*.py")):
        name = ".".join(file.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = file
    return found


def _imports(name: str, file: Path) -> set[str]:
    """Every module ``file`` imports, at module level or inside a function (``from x import y`` gives x and x.y)."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return out


def _floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 and parts[1] in FLOORS else None


def test_every_module_of_harness_sits_on_a_floor():
    folders = {p.parent.name for p in (ROOT / "harness").glob("*/__init__.py")}
    assert folders == set(FLOORS), folders ^ set(FLOORS)
    assert {name for name in _modules() if _floor(name) is None} == ENTRY_POINTS


def test_each_floor_imports_only_its_own_floor_and_those_below():
    upward = {
        (name, target)
        for name, file in _modules().items()
        if _floor(name)
        for target in _imports(name, file)
        if _floor(target) and FLOORS.index(_floor(target)) > FLOORS.index(_floor(name))
    }
    assert not upward, sorted(upward)


def test_the_readme_states_the_floor_order():
    """docs/development.md says the order in a line and lists the floors in it in its layout table."""
    text = (ROOT / "docs" / "development.md").read_text()
    assert " < ".join(f"`{floor}`" for floor in FLOORS) in " ".join(text.split())
    rows = re.findall(r"^\| `harness/(\w+)/` \|", text, re.MULTILINE)
    assert tuple(rows) == FLOORS, rows


def test_harness_imports_no_method_or_attack():
    """The registry loads plugins by their ``module:Class`` strings; a module of harness/ that imported one would make
    the built-in plugins different from an outside package's."""
    found = {
        (name, target)
        for name, file in _modules().items()
        for target in _imports(name, file)
        if target.split(".")[0] in PLUGINS
    }
    assert not found, sorted(found)


def test_methods_and_attacks_import_only_the_contract_and_below():
    top = FLOORS.index(PLUGIN_FLOOR)
    upward = {
        (name, target)
        for name, file in _modules(*PLUGINS).items()
        for target in _imports(name, file)
        if _floor(target) and FLOORS.index(_floor(target)) > top
    }
    assert not upward, sorted(upward)
    assert _modules(*PLUGINS)  # the walk saw the plugins


def test_the_two_plugin_families_never_import_each_other():
    """Siblings inside one family may share code (``attacks/distillation.py`` trains with the fine-tuning attack's
    loop, ``methods/decoding_time.py`` samples with the ``gu_*`` keys); a method never imports an attack, nor an
    attack a method: what one family needs of the other goes through the contract (a detector, a key)."""
    crossing = {
        (name, target)
        for family, other in (("methods", "attacks"), ("attacks", "methods"))
        for name, file in _modules(family).items()
        for target in _imports(name, file)
        if target == other or target.startswith(f"{other}.")
    }
    assert not crossing, sorted(crossing)
    assert _modules("methods") and _modules("attacks")  # the walk saw both families


def test_the_contract_takes_settings_types_not_the_presets():
    """A plugin's contract names the settings it is given (``harness.config.settings``), never the presets' data
    (tiny, smol, ...): a plugin written from outside depends on the types, not on this repository's presets."""
    reading = {
        (name, target)
        for name, file in _modules("harness/contract").items()
        for target in _imports(name, file)
        if target == "harness.config.presets" or target.startswith("harness.config.presets.")
    }
    assert not reading, sorted(reading)
    assert "harness.contract.method" in _modules("harness/contract")  # the walk saw the contract


def test_the_repository_has_no_import_circle():
    modules = _modules("harness", *PLUGINS)
    graph = {name: {t for t in _imports(name, file) if t in modules and t != name} for name, file in modules.items()}
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(node) :] + [node])}")
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    assert "harness.report.collect" in graph and graph["harness.cell.scoring"]  # the walk saw real modules


def test_the_report_names_no_method_or_attack():
    """harness/report reads labels, categories and table membership from the plugins; a name written into it (a
    filter on "dipper", a column order of labels) would leave an outside plugin out of the tables."""
    from harness.config.registry import attacks, methods

    names: set[str] = set()
    for registry in (methods, attacks):
        for name in registry.ordered():
            cls = registry.load(name)
            names |= {name, cls.label, getattr(cls, "category", name)} - {""}
    for file in sorted((ROOT / "harness" / "report").glob("*.py")):
        literals = {n.value for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.Constant)}
        assert not literals & names, (file.name, literals & names)
