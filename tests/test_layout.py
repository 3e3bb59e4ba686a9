"""The code's layout: the packages are layers, each importing only what its own
``__init__`` docstring's "May import" line names (no module list kept here); no import
circle; small modules; the engine handed its planner; drafter names compared only in the
name table; no probing of backends; and the documents the code points at exist."""

import ast
import re
import sys
from pathlib import Path

from edgespec.core.backend import Backend
from edgespec.core.draft import Drafter
from edgespec.core.planner import Planner, Planners
from edgespec.drafters.prediction import PredictedOutput
from edgespec.drafters.registry import BUILTIN, MODEL, NONE

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "edgespec"
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import imports, mermaid, modules, unit  # noqa: E402  (the code's import graph)


def may_import(name: str, path: Path) -> set[str]:
    """The layers a unit's docstring says it may import ("May import: a, b.")."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = re.search(r"May import: ([^.]+)\.", " ".join(doc.split()))
    assert found, f"{path.relative_to(ROOT)} says nothing of what it may import"
    listed = found.group(1).strip()
    return set() if listed.startswith("nothing") else {u.strip() for u in listed.split(",")}


def units() -> dict[str, set[str]]:
    """Each layer and what it may import, from its ``__init__`` (or its own) docstring."""
    known = modules()
    return {name: may_import(name, path) for name, path in known.items()
            if "." not in name and name}


def test_each_layer_imports_only_what_its_docstring_allows():
    known = modules()
    allowed = units()
    assert {unit(n) for n in known if n} == set(allowed)
    upward = sorted((name, target) for name, path in known.items()
                    for target in imports(name, path, set(known))
                    if target and name and unit(target) != unit(name)
                    and unit(target) not in allowed[unit(name)])
    assert not upward, f"imports a layer may not make: {upward}"
    top = may_import("", known[""])  # the package itself: its public names
    assert all(unit(t) in top for t in imports("", known[""], set(known)))


def test_the_layers_allowed_form_no_circle():
    allowed = units()
    for name, below in allowed.items():
        assert below <= set(allowed), f"{name} names a layer that does not exist: {below - set(allowed)}"
    order, state = [], {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for lower in sorted(allowed[name]):
            assert state.get(lower) != 1, "layers in a circle: " + " -> ".join(path + [name, lower])
            if lower not in state:
                visit(lower, path + [name])
        state[name] = 2
        order.append(name)

    for name in sorted(allowed):
        if name not in state:
            visit(name, [])


def test_there_is_no_import_circle():
    known = modules()
    graph = {name: imports(name, path, set(known)) & set(known) for name, path in known.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(path + [name, target]))
            if target not in state:
                visit(target, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_no_module_is_longer_than_400_lines():
    too_long = {name: n for name, path in modules().items()
                if (n := len(path.read_text().splitlines())) > 400}
    assert not too_long, too_long


def test_at_most_twelve_modules_sit_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_the_engine_builds_no_planner():
    """Auto mode is built by the planner package's factory and handed to the engine: the
    engine imports nothing from the planner package (its costs, calibration, assembly)."""
    known = modules()
    used = imports("core.engine", known["core.engine"], set(known))
    assert not {t for t in used if unit(t) == "planner"}, used
    source = known["core.engine"].read_text()
    for word in ("calibrat", "CostModel", "auto_planner", "PassTimer"):
        assert word not in source, word


def test_drafter_names_are_compared_only_in_the_name_table():
    """No string equal to a drafter's name outside drafters/ (where the registry and the
    drafters that carry their own names live): everything else asks the registry."""
    names = set(BUILTIN) | {MODEL}
    # "model" is also a JSON field (a request's model) and a drafter kind; those uses
    # are keys, not drafter names: only comparisons and defaults are looked at for it.
    # (OFF, "off", is every switch's word, from /draft on|off to a progress bar's.)
    found = []
    for name, path in modules().items():
        if unit(name) == "drafters":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
            elif isinstance(node, ast.keyword) and node.arg == "default":
                values = [node.value]
            elif isinstance(node, ast.Assign):
                values = [node.value]
            else:
                continue
            for value in values:
                for const in ast.walk(value):
                    if isinstance(const, ast.Constant) and const.value in names:
                        if const.value == MODEL and isinstance(node, ast.Assign):
                            continue
                        found.append((name, const.value, getattr(node, "lineno", 0)))
    assert not found, found


def test_no_drafter_or_prediction_word_where_a_drafter_is_named():
    """"none" (no drafter) and "prediction" (Predicted Outputs' drafter) are words other
    fields use too (tool_choice "none", a CSP's 'none'): wherever a drafter is named (a
    comparison, a lookup, a default or a keyword of something called drafter), they come
    from the registry or the drafter, not a literal. core/draft.py defines the one
    below the registry that the engine's stats use (NO_DRAFTER)."""
    words = {NONE, PredictedOutput.name}
    found = []
    for name, path in modules().items():
        if unit(name) == "drafters" or name == "core.draft":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                about, values = [node.left, *node.comparators], [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                about, values = [node.func.value], node.args[:1]
            elif isinstance(node, ast.Subscript):
                about, values = [node.value], [node.slice]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                about, values = [node.target], [node.value]
            elif isinstance(node, ast.keyword) and node.arg:
                about, values = [ast.Name(node.arg)], [node.value]
            else:
                continue
            if not any("drafter" in ast.unparse(a).lower() for a in about):
                continue
            for value in values:
                for const in ast.walk(value):
                    if isinstance(const, ast.Constant) and const.value in words:
                        found.append((name, const.value, getattr(node, "lineno", 0)))
    assert not found, found


def _members(protocol) -> set[str]:
    return {n for n in list(vars(protocol)) + list(getattr(protocol, "__annotations__", {}))
            if not n.startswith("_")}


def test_no_hasattr_on_a_protocol_member():
    """What the protocols declare (Drafter, Backend, Planner, Planners) every
    implementation has (DrafterBase gives the defaults): asking hasattr() about one
    hides a missing method instead of failing. (A library's object, say a tokenizer's
    close(), is not one of them.)"""
    members = _members(Drafter) | _members(Backend) | _members(Planner) | _members(Planners)
    found = []
    for path in list(PACKAGE.rglob("*.py")) + list((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr" and \
                    len(node.args) == 2 and isinstance(node.args[1], ast.Constant) and \
                    node.args[1].value in members and \
                    re.search(r"backend|target|model|drafter|planner|lookup|\bd\b", ast.unparse(node.args[0])):
                found.append((str(path.relative_to(ROOT)), node.args[1].value, node.lineno))
    assert "forget" in members and "prefill" in members
    assert not found, found


def test_no_script_drafts_a_round_of_its_own():
    """A script that replays or measures drafting goes through the engine's round code
    (core.planner.draft_round): one that asked a planner to plan or review, or a drafter
    to propose, itself could drift from what the engine does (planner_sim once did:
    it asked a copy drafter for the round's whole limit, not the proposal's length)."""
    found = []
    for path in (ROOT / "scripts").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("plan", "review", "propose"):
                found.append((path.name, ast.unparse(node.func), node.lineno))
    assert not found, found


def test_nothing_probes_a_backend_with_getattr():
    """Everything read from a backend is declared by the Backend protocol (with
    BackendFacts' defaults): no getattr(backend-ish, ...) outside the backends."""
    found = []
    for name, path in modules().items():
        if unit(name) == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args:
                subject = ast.unparse(node.args[0])
                if re.search(r"backend|target|model|engine|\bd\b|drafter", subject):
                    found.append((name, subject, node.lineno))
    assert not found, found


def test_the_documents_the_readme_and_the_code_point_at_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+\.md)\)", readme)
    assert "docs/design.md" in links and "CONTRIBUTING.md" in links
    for doc in ROOT.glob("docs/*.md"):
        links += [f"docs/{link}" for link in re.findall(r"\]\(([^)#/]+\.md)\)", doc.read_text())]
    for source in PACKAGE.rglob("*.py"):
        links += re.findall(r"\b(docs/[a-z-]+\.md)", source.read_text())
    missing = sorted({link for link in links if not (ROOT / link).exists()})
    assert not missing, missing


def test_the_design_document_shows_the_import_graph_of_the_code():
    """docs/design.md's picture of the layers is the one scripts/import_graph.py draws
    from the code now (regenerate it with that script after moving an import)."""
    assert f"```mermaid\n{mermaid()}\n```" in (ROOT / "docs" / "design.md").read_text()
