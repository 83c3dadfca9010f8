from pathlib import Path

TINY = Path(__file__).parent / "files" / "tiny.toml"


def read_ledger(out: Path) -> tuple[dict, dict]:
    """A finished run's jobs by name and its metrics by ``(job name, metric)``."""
    from lmckit.experiments.ledger import Ledger

    ledger = Ledger(out / "ledger.sqlite")
    try:
        jobs = {j["name"]: j for j in ledger.jobs()}
        metrics = {(m["name"], m["metric"]): m["value"] for m in ledger.metrics()}
    finally:
        ledger.close()
    return jobs, metrics
