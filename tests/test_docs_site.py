"""The documentation site: it builds offline in strict mode, a broken link fails the build,
and in headless Chromium its pages render with working navigation and search and no
console errors. LMCKIT_SCREENSHOTS=DIR keeps the pages' screenshots."""

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
PAGES = {
    "home": "index.html",
    "guide": "guides/your-model.html",
    "api": "api/lmckit.match.weight.html",
    "reproductions": "reproductions.html",
}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(
        [*command, "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, env=env
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = _build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_site_has_every_page_and_the_generated_references(site):
    for page in PAGES.values():
        assert (site / page).is_file(), page
    assert (site / "guides" / "experiment-reference.html").is_file()
    assert (site / "experiments" / "width-fmnist.toml").is_file()  # linked from the pages
    api = (site / "api" / "lmckit.match.weight.html").read_text()
    assert "weight_matching" in api and "include_running_stats" in api  # from the docstring


def _make_test_docs_command() -> list[str]:
    """The mkdocs command line of the Makefile's ``test`` recipe, as `make test` runs it."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    line = next(x for x in recipe.splitlines() if "mkdocs build" in x)
    words = line.split()
    return [sys.executable, "-m", "mkdocs", *words[words.index("$(BIN)/mkdocs") + 1 :]]


def test_a_broken_link_fails_the_test_commands_build(tmp_path):
    """The test command builds the site in strict mode: a page linking to a page that does
    not exist stops it, naming the link (run with the Makefile's own command line: a
    ``--quiet`` there once hid the warnings strict mode counts, and the build passed)."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("hooks"))
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text()
    text = text.replace("docs/hooks/", f"{ROOT}/docs/hooks/").replace(
        "paths: [src]", f"paths: [{ROOT}/src]"
    )
    config.write_text(text.replace("docs_dir: docs", f"docs_dir: {docs}"))
    command = [*_make_test_docs_command(), "-f", str(config), "--site-dir", str(tmp_path / "s")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}

    page = docs / "guides" / "gpu.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode != 0
    # the link alone breaks it: the copy is sound, its one complaint is the missing page
    complaints = [x for x in result.stderr.splitlines() if x.startswith(("WARNING", "ERROR"))]
    assert len(complaints) == 1 and "no-such-page.md" in complaints[0], result.stderr[-2000:]


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/install-browser.sh)"
)
def test_the_pages_render_navigate_and_search_in_chromium(site, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    shots = Path(os.environ.get("LMCKIT_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            for name, path in PAGES.items():
                page.goto(base + path)
                assert page.locator("article h1").first.is_visible(), name
                page.screenshot(path=str(shots / f"site-{name}.png"))
            # navigation: from the home page to the errors through the side bar
            page.goto(base + "index.html")
            page.locator("nav.md-nav--primary a.md-nav__link", has_text="Errors").first.click()
            page.wait_for_url("**/errors.html")
            assert "Errors" in page.locator("article h1").first.inner_text()
            # search: the index is built offline and answers a query
            page.keyboard.press("/")  # Material's shortcut to the search box
            page.locator("input.md-search__input").type("weight matching", delay=20)
            results = page.locator(".md-search-result__item")
            results.first.wait_for(timeout=15_000)
            assert results.count() > 0
            page.screenshot(path=str(shots / "site-search.png"))
            browser.close()
    finally:
        server.shutdown()
    assert problems == []
