from pathlib import Path

TINY = Path(__file__).parent / "files" / "tiny.toml"
