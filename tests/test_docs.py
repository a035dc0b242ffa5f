"""The documentation against the code: the generated pass page, a short README that links every page, links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

from scripts.passes_page import PAGE, render_page

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
README_MAX_LINES = 300
README_MAX_DATED_LINES = 3
CI_MARKER = "<!-- ci-test-command -->"
CI_COMMAND = (
    "pip install -c requirements.lock torch && pip install -c requirements.lock -e '.[test]' && "
    "python -m pytest -q --tier artifact -n 2 --dist loadfile --durations=25"
)
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target): inline links, the only kind these pages use
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _pages() -> list[Path]:
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 10, f"precondition: docs/ holds the topic pages, found {[p.name for p in pages]}"
    return pages


def _links(path: Path) -> list[str]:
    """The link targets of ``path``, code spans and blocks left out (a `[x](y)` in code is no link)."""
    return LINK.findall(CODE.sub("", path.read_text(encoding="utf-8")))


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for ``path``'s headings: lower case, punctuation dropped (``_`` and ``-`` kept), spaces to ``-``."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_passes_page_is_what_the_registry_generates():
    from aot.passes import registry

    assert registry.all_passes(), "precondition: the registry holds passes"
    generated = render_page()
    assert all(f"## {info.name}\n" in generated for info in registry.all_passes()), "every registered pass has a section"
    assert PAGE.read_text(encoding="utf-8") == generated, "docs/passes.md is out of date: run python scripts/passes_page.py"


def test_readme_is_short_and_nearly_undated():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), "precondition: README.md has a title"
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"
    dated = [line for line in lines if DATE.search(line)]
    assert len(dated) <= README_MAX_DATED_LINES, f"dated lines belong in docs/performance.md: {dated}"


def test_every_page_is_linked_from_the_readme_and_every_link_resolves():
    pages = _pages()
    readme_targets = {target.split("#")[0] for target in _links(README)}
    unlinked = [page.name for page in pages if f"docs/{page.name}" not in readme_targets]
    assert not unlinked, f"README.md links no {unlinked}"
    broken = []
    for source in [README, *pages]:
        links = _links(source)
        assert source != README or links, "precondition: README.md has links"
        for target in links:
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of this repository
                continue
            path, _, anchor = target.partition("#")
            resolved = (source.parent / path).resolve() if path else source
            if not resolved.exists():
                broken.append(f"{source.relative_to(REPOSITORY)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{source.relative_to(REPOSITORY)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_holds_the_ci_test_command():
    text = README.read_text(encoding="utf-8")
    assert text.count(CI_MARKER) == 1, f"precondition: README.md has one {CI_MARKER} line"
    after = text.split(CI_MARKER, 1)[1].lstrip("\n").splitlines()
    assert after[0].startswith("```"), "the marker is followed by a fenced block"
    block = after[1 : after.index("```", 1)]
    assert block == [CI_COMMAND], block


def test_readme_exit_code_table_lists_every_code_aot_uses():
    from aot.errors import EXIT_CODES

    text = README.read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+?) \|$", section, flags=re.MULTILINE)}
    assert len(EXIT_CODES) >= 8, "precondition: aot.errors names its exit codes"
    assert sorted(rows) == sorted(EXIT_CODES), f"README.md's exit codes {sorted(rows)}, aot.errors' {sorted(EXIT_CODES)}"
    for code, meaning in EXIT_CODES.items():  # `aot exit-codes` prints these: one text, said twice, held equal
        assert rows[code] == meaning, f"exit {code}: README.md says {rows[code]!r}, aot exit-codes {meaning!r}"
