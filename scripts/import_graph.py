"""Draw edgespec's import graph by package: which layer imports which (mermaid).

    python scripts/import_graph.py            # the graph, as docs/design.md shows it
    python scripts/import_graph.py --modules  # every module's edgespec imports, by layer

The layers are the packages directly under edgespec/ (and its top-level modules); an
arrow A --> B says some module of A imports one of B. Arrows implied by others (A --> B
--> C makes A --> C implied) are left out, so the picture shows the layering;
``--all`` keeps them. tests/test_layout.py checks that docs/design.md shows this graph.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "edgespec"


def modules() -> dict[str, Path]:
    """Every module of edgespec by dotted name ("" for the package itself)."""
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


def unit(name: str) -> str:
    """The layer of a module: its package directly under edgespec/, or itself."""
    return name.split(".")[0]


def layer_edges(*, reduce: bool = True) -> set[tuple[str, str]]:
    """(importer, imported) between layers, the implied ones left out when ``reduce``."""
    known = modules()
    edges = {(unit(name), unit(target)) for name, path in known.items() if name
             for target in imports(name, path, set(known))
             if target and unit(target) != unit(name)}
    if not reduce:
        return edges
    reach: dict[str, set[str]] = {}

    def below(node: str) -> set[str]:
        if node not in reach:
            reach[node] = set()
            for a, b in edges:
                if a == node:
                    reach[node] |= {b} | below(b)
        return reach[node]

    return {(a, b) for a, b in edges
            if not any(b in below(c) for x, c in edges if x == a and c != b)}


def mermaid() -> str:
    """The layer graph as a mermaid flowchart, top layer first."""
    lines = ["graph TD"] + [f"    {a} --> {b}" for a, b in sorted(layer_edges())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="every module's imports")
    parser.add_argument("--all", action="store_true", help="keep the implied arrows too")
    args = parser.parse_args()
    if args.modules:
        known = modules()
        for name in sorted(known):
            targets = sorted(t for t in imports(name, known[name], set(known)) if t)
            print(f"{name or 'edgespec'}: {', '.join(targets)}")
    elif args.all:
        print("\n".join(["graph TD"] + [f"    {a} --> {b}" for a, b in sorted(layer_edges(reduce=False))]))
    else:
        print(mermaid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
