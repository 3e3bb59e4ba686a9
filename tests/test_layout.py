"""The code's layout: imports go down the layers (no circle), modules stay small, and
the documents the code and the README point at exist."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "edgespec"

# Each module's layer, from the bottom (docs/design.md): a module may import its own
# layer and those below, never one above.
LAYERS = [
    {"errors", "coupling", "detokenize", "stats", "chat_template", "prompt_sets",
     "models", "models.arguments", "models.catalog"},
    {"sampling", "shaping", "grammar", "cache", "compat", "backends", "backends.base", "backends.repack", "backends.kernels", "backends.rpc",
     "backends.llama_lib", "backends.gguf_tokenizer"},
    {"acceptance", "prompting", "quantize", "backends.llamacpp", "backends.mlx_ops",
     "backends.mlx_backend", "backends.gguf_mlx", "backends.toy", "backends.table", "backends.simulated"},
    {"drafters", "drafters.base", "drafters.breaks", "drafters.copying", "drafters.prompt_lookup",
     "drafters.suffix", "drafters.draft_model", "drafters.scheduled", "drafters.last_line", "drafters.prediction",
     "drafters.registry", "ceiling"},
    {"planning.base", "costs", "calibration", "profiles"},
    {"planning", "planning.config", "planning.estimates", "planning.budget", "planning.adaptive"},
    {"planning.auto"},
    {"engine", "generation"},
    {"session", "models.loading", "api", "bench", "bench_report", "selfcheck", "openai_api", "openai_fields",
     "replies", "server", "info", "llama_api", "metrics", "server_http", "native_routes", "page"},
    {"cli_options", "chat_cli", "cli", "__main__", ""},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        found[name.removesuffix("__init__").rstrip(".")] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The edgespec modules ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = parts[:len(parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("edgespec"):
                target = node.module.removeprefix("edgespec").lstrip(".")
            else:
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}".lstrip(".")
                found.add(candidate if candidate in known else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("edgespec").lstrip(".") for a in node.names
                      if a.name.startswith("edgespec")}
    return found - {name}


def test_every_module_has_a_layer_and_imports_only_its_own_and_lower_ones():
    known = modules()
    assert set(known) <= set(LAYER), f"modules without a layer: {sorted(set(known) - set(LAYER))}"
    upward = [(name, target) for name, path in known.items()
              for target in imports(name, path, set(known))
              if target in LAYER and LAYER[target] > LAYER[name]]
    assert not upward, f"imports from a lower layer to a higher one: {upward}"


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
