"""`scripts/mutate.py` stays anchored to the code: every mutation's snippet occurs exactly
once in its file and its tests exist (a refactor that moves a snippet fails here, in CI,
not only when someone next runs the mutation script)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutation_finds_its_snippet_once_and_its_tests():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mutate
    finally:
        sys.path.pop(0)
    unanchored = []
    for m in mutate.MUTATIONS:
        path = ROOT / m.path
        found = path.read_text().count(m.old) if path.is_file() else None
        absent = [t for t in m.tests if not (ROOT / t.split("::")[0]).exists()]
        if found != 1 or absent:
            unanchored.append(f"{m.name}: {m.path} holds its snippet {found} times; {absent}")
    assert not unanchored, "\n".join(unanchored)
    assert len({m.name for m in mutate.MUTATIONS}) == len(mutate.MUTATIONS)
