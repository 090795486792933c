"""The config table (``setting()`` beside each field) and the references written for people:
``ruseon.example.toml`` and README's table list every key, and no key that is gone."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.config import (
    SECTIONS,
    TABLES,
    Config,
    ConfigError,
    Setting,
    env_name,
    flags,
    load_config,
    section_classes,
    setting,
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


def as_text(row: Setting, value: Any) -> str:
    """A value as an environment variable spells it."""
    if row.render is not None:  # a type of its own: its TOML form, unquoted
        return row.render(value).strip('"')
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def test_every_section_key_has_its_environment_variable(tmp_path: Path) -> None:
    """RUSEON_<SECTION>_<KEY> reaches every key of every section (tables have none)."""
    env = {env_name(section, key): as_text(row, getattr(
        Config().cameras[0] if section == "camera" else getattr(Config(), section), key))
        for section, cls in section_classes() if section == "camera" or section not in TABLES
        for key, row in settings(cls)}
    assert env["RUSEON_WEBRTC_MAX_VIEWERS_PER_ADDRESS"] == "0"
    assert load_config(tmp_path / "absent.toml", env=env) == Config()
    env["RUSEON_RECORDING_POSTROLL_S"] = "7.5"
    assert load_config(tmp_path / "absent.toml", env=env).recording.postroll_s == 7.5


# A value for every flag the table gives a setting, and where it lands.
FLAG_VALUES = {
    "--source": ("synthetic", lambda c: c.default_camera.source, "synthetic"),
    "--http": ("127.0.0.1:9", lambda c: str(c.http.listen), "127.0.0.1:9"),
    "--rtc": ("127.0.0.1:10", lambda c: str(c.webrtc.listen), "127.0.0.1:10"),
    "--advertise": ("192.0.2.1", lambda c: c.webrtc.advertise, ("192.0.2.1",)),
    "--max-viewers": ("7", lambda c: c.webrtc.max_viewers, 7),
    "--token": ("t0ken", lambda c: c.auth.token, "t0ken"),
    "--state-dir": ("/tmp/s", lambda c: c.state.dir, "/tmp/s"),
    "--log-level": ("debug", lambda c: c.log.level, "debug"),
    "--rtsp": ("127.0.0.1:11", lambda c: (str(c.rtsp.listen), c.rtsp.enable),
               ("127.0.0.1:11", True)),
    "--record-dir": ("/tmp/r", lambda c: (c.recording.dir, c.recording.continuous),
                     ("/tmp/r", True)),
    "--mqtt": ("mqtt://192.0.2.2", lambda c: c.mqtt.url, "mqtt://192.0.2.2"),
}


def test_every_flag_in_the_table_sets_its_setting() -> None:
    from ruseon_appliance.cli import build_parser, config_from_args

    assert sorted(row.flag.name for _, _, row in flags() if row.flag) == sorted(FLAG_VALUES)
    for name, (value, read, expected) in FLAG_VALUES.items():
        args = build_parser().parse_args(["config", "--config", "/dev/null", name, value])
        assert read(config_from_args(args)) == expected, name


@dataclass(frozen=True, slots=True)
class Size:
    width: int = setting(640, lo=16, hi=4096)
    height: int = setting(360, lo=16, hi=4096)


def parse_on(key: str, value: Any, from_text: bool) -> bool | Size:
    """``false``/``true`` or a table (as a camera's ``substream`` is)."""
    from ruseon_appliance import config as cfg

    if isinstance(value, bool):
        return value
    built: Size = cfg._build(Size(), value, key, from_text, origin="", table=key)
    return built


def render_on(value: bool | Size) -> str:
    from ruseon_appliance import config as cfg

    return cfg._render(value)


@dataclass(frozen=True, slots=True)
class Section:
    size: Size = setting(Size())
    extra: bool | Size = setting(False, parse=parse_on, render=render_on)
    url: str = setting("", secret="url")


def test_a_table_field_and_a_field_of_its_own_type() -> None:
    """What a camera's ``substream`` needs: a nested table (a dataclass, built and validated by
    the same code, shown as an inline table) or a type of its own (``parse``/``render``)."""
    from ruseon_appliance import config as cfg

    built = cfg._build(Section(), {"size": {"width": 320}, "extra": {"height": 240},
                                   "url": "rtsp://u:pw@192.0.2.3/s"}, "camera", False,
                       origin="the test", table="[camera]")
    assert built.size == Size(320, 360) and built.extra == Size(640, 240)
    assert cfg._lines(built, True) == ["size = { width = 320, height = 360 }",
                                       "extra = { width = 640, height = 240 }",
                                       'url = "rtsp://u:***@192.0.2.3/s"']
    assert cfg._lines(dataclasses.replace(built, extra=True), False)[1] == "extra = true"
    with pytest.raises(ConfigError, match=r"camera\.size\.height = 8 is not valid: 16 to 4096"):
        cfg._validate_section(dataclasses.replace(built, size=Size(320, 8)), "camera")
    with pytest.raises(ConfigError,
                       match=r"camera\.size\.depth is not a known key: camera\.size allows width"):
        cfg._build(Section(), {"size": {"depth": 1}}, "camera", False, origin="the test",
                   table="[camera]")
    with pytest.raises(ConfigError, match=r"camera\.size = 3 is not valid: expected Size"):
        cfg._build(Section(), {"size": 3}, "camera", False, origin="the test", table="[camera]")
