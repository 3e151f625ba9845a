"""The docs keep up with the code: an ADR index that lists every record, a README per package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADRS = ROOT / "docs" / "adr"
PACKAGES = [
    "activities", "bench", "bigfleet", "clusters", "migrations", "nanook",
    "providers", "shard_engine", "simulator", "tests", "workflows",
]  # fmt: skip


def test_the_adr_index_lists_every_record_and_nothing_else() -> None:
    records = {p.name for p in ADRS.glob("[0-9][0-9][0-9][0-9]-*.md")}
    linked = set(re.findall(r"\]\(([0-9]{4}-[^)]+\.md)\)", (ADRS / "README.md").read_text()))
    assert linked == records


def test_adr_numbers_are_not_reused() -> None:
    numbers = [p.name[:4] for p in ADRS.glob("[0-9][0-9][0-9][0-9]-*.md")]
    assert len(numbers) == len(set(numbers))


def test_every_top_level_package_has_a_readme_naming_its_modules() -> None:
    for package in PACKAGES:
        readme = ROOT / package / "README.md"
        assert readme.exists(), f"{package}/README.md is missing"
        text = readme.read_text()
        modules = [
            p.name
            for p in (ROOT / package).glob("*.py")
            if p.name not in ("__init__.py", "__main__.py", "conftest.py")
        ]
        missing = [m for m in modules if m not in text]
        assert not missing, f"{package}/README.md does not mention {missing}"


def test_the_application_readme_names_every_part_of_the_shard_process() -> None:
    text = (ROOT / "bigfleet" / "README.md").read_text()
    parts = [p.name for p in (ROOT / "bigfleet" / "shard").glob("*.py") if p.name != "__init__.py"]
    missing = [p for p in parts if f"shard/{p}" not in text]
    assert not missing, f"bigfleet/README.md does not mention {missing}"
