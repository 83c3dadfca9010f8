"""The layers of `src/lmckit`, read from its imports (every import, the ones inside
functions too): each package or top-level module has a rank, and every import points to a
lower rank — no import points up or sideways, so there is no cycle between them. A new
package gets its rank here, and its line on `docs/development.md`'s layer list."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "lmckit"

LAYERS: dict[int, tuple[str, ...]] = {
    12: ("cli",),
    11: ("experiments",),
    10: ("workflows",),
    9: ("model_folder",),
    8: ("analysis", "merge"),
    7: ("checkpoint", "train", "match", "plots"),
    6: ("models", "evaluate"),
    5: ("tracing",),
    4: ("transform", "budget", "metrics", "store"),
    3: ("perm", "functional"),
    2: ("params", "data", "lap", "registry", "resume", "kinds"),
    1: ("options", "progress", "optim", "files", "_checks", "_warm_jv", "_catalog", "_moved"),
    0: ("errors",),
}
"""Rank → the packages and top-level modules on it (higher ranks import lower ones)."""

RANK = {name: rank for rank, names in LAYERS.items() for name in names}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "lmckit"


def imports() -> dict[str, set[str]]:
    """Package-level import edges of `src/lmckit` (the package root and the old paths kept
    for one release left out: the root re-exports, the old paths alias)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "\nalias(__name__" in text:
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmckit"):
                names = [node.module]
                if node.module == "lmckit":
                    names = [f"lmckit.{a.name}" for a in node.names if a.name != "__version__"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("lmckit")]
            else:
                continue
            for name in names:
                if _unit(module) != _unit(name) and _unit(module) != "lmckit":
                    edges[_unit(module)].add(_unit(name))
    return edges


def test_every_package_has_a_layer():
    units = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    units |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    units -= {_old for _old in units if _is_old_path(_old)}
    assert sorted(units - set(RANK)) == [], "give each new package its rank in LAYERS"
    assert sorted(set(RANK) - units) == [], "LAYERS names a package that is gone"


def _is_old_path(unit: str) -> bool:
    init = PACKAGE / unit / "__init__.py"
    path = init if init.is_file() else PACKAGE / f"{unit}.py"
    return "\nalias(__name__" in path.read_text()


def test_every_import_points_down():
    up = [
        f"{a} (layer {RANK[a]}) imports {b} (layer {RANK[b]})"
        for a, targets in sorted(imports().items())
        for b in sorted(targets)
        if RANK[b] >= RANK[a]
    ]
    assert up == []


def test_the_development_page_names_every_package():
    page = (ROOT / "docs" / "development.md").read_text()
    missing = [name for name in RANK if f"`{name}" not in page]
    assert missing == []
