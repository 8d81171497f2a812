"""The documentation's relative links and the recorded benchmark runs stay consistent.

Every relative link of README.md and docs/ names a file that exists and, where it names an anchor,
a heading or ``<a id>`` of that file (GitHub's anchor rule: lower case, punctuation other than
``-`` and ``_`` dropped, spaces to ``-``). Every file of ``benchmarks/results/`` is indexed in
docs/benchmarks.md and holds the fields the page says it holds.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set:
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.cpu_only
def test_anchor_rule_matches_github():
    """The slug rule above on the kinds of headings the docs have (code spans, parentheses, '=')."""
    tmp = "## What would beat the KV-major floor (built as `combine=fused`: removed)\n"
    slug = re.sub(r"[^\w\- ]", "", tmp[3:].strip().lower()).replace(" ", "-")
    assert slug == "what-would-beat-the-kv-major-floor-built-as-combinefused-removed"


@pytest.mark.cpu_only
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no such heading or anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.cpu_only
def test_every_recorded_run_is_indexed_and_well_formed():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    required = {"commit", "date", "gpu", "title", "scope", "commands", "ceilings", "text", "rows"}
    problems = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        missing = required - data.keys()
        if missing:
            problems.append(f"{path.name}: no {sorted(missing)}")
        if f"(../benchmarks/results/{path.name})" not in page:
            problems.append(f"{path.name}: not linked from docs/benchmarks.md")
        summary = data.get("session_summary")
        if summary is not None:
            if {"session", "heading", "commits", "text"} - summary.keys():
                problems.append(f"{path.name}: session_summary lacks a field")
            elif data["commit"] not in summary["commits"]:
                problems.append(f"{path.name}: session_summary does not name the file's commit")
    assert not problems, "; ".join(problems)
