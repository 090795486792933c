"""The config table (``setting()`` beside each field) and the references written for people:
``ruseon.example.toml`` and README's table list every key, and no key that is gone."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from ruseon_appliance.config import (
    SECTIONS,
    TABLES,
    Config,
    load_config,
    section_classes,
    settings,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "ruseon_appliance" / "ruseon.example.toml"


def example_with_its_tables() -> str:
    """The example file with its commented-out ``[[relay]]`` and ``[[webhook]]`` tables (a block
    from ``# [[name]]`` to the next line that is not a comment) uncommented."""
    lines, in_table = [], False
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith("# [["):
            in_table = True
        elif not line.startswith("#"):
            in_table = False
        if in_table and re.match(r"# (\[\[\w+\]\]|\w+ = )", line):
            line = line[2:]
        lines.append(line)
    return "\n".join(lines) + "\n"


def keys_of(cls: type) -> set[str]:
    return {name for name, _ in settings(cls)}


def test_the_example_file_documents_every_key_and_no_other() -> None:
    data: dict[str, Any] = tomllib.loads(example_with_its_tables())
    assert sorted(data) == sorted(SECTIONS)
    for section, cls in section_classes():
        tables = data[section] if isinstance(data[section], list) else [data[section]]
        for table in tables:
            missing, stale = keys_of(cls) - set(table), set(table) - keys_of(cls)
            assert not missing and not stale, (section, "missing", missing, "stale", stale)


def test_the_example_file_shows_the_defaults_and_its_tables_load(tmp_path: Path) -> None:
    # "Every key is optional; the values shown are the defaults."
    assert load_config(EXAMPLE, env={}, required=True) == Config()
    path = tmp_path / "ruseon.toml"
    path.write_text(example_with_its_tables())
    config = load_config(path, env={}, required=True)
    assert [r.name for r in config.relay] == ["janus"] and len(config.webhook) == 1


def readme_rows() -> dict[str, str]:
    """README's configuration table: ``{section: the keys column}``."""
    rows: dict[str, str] = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        match = re.match(r"\| `\[\[?(\w+)\]\]?`[^|]* \| (.*) \|$", line)
        if match:
            rows[match[1]] = match[2]
    return rows


def test_the_readme_table_lists_every_key_and_no_other() -> None:
    rows = readme_rows()
    assert sorted(rows) == sorted(SECTIONS)
    every_key = set().union(*(keys_of(cls) for _, cls in section_classes()))
    for section, cls in section_classes():
        named = set(re.findall(r"`(\w+)`", rows[section]))
        missing = keys_of(cls) - named
        # A backquoted word with an underscore is a key: of this section, or another's.
        stale = {word for word in named - keys_of(cls) if "_" in word} - every_key
        assert not missing and not stale, (section, "missing", missing, "stale", stale)
    assert set(TABLES) <= set(rows)
