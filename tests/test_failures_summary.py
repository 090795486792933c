"""scripts/test's last words on a red run (tests/failures.py): each failure's E lines."""

from __future__ import annotations

from pathlib import Path

from tests.failures import LINES_PER_TEST, summary

JUNIT = """<testsuites><testsuite>
<testcase classname="tests.e2e.test_hil" name="test_battery" time="12.3">
<failure message="AssertionError: long">def test():
&gt;   assert rc == 0, output
E   AssertionError: the battery failed
{lines}
E   assert 1 == 0
tests/e2e/test_hil.py:50: AssertionError</failure></testcase>
<testcase classname="tests.a" name="test_ok" time="0.1"/>
<testcase classname="tests.b" name="test_setup" time="0.2"><error message="fixture broke">
tests/b.py:3: in fixture</error></testcase>
</testsuite></testsuites>"""


def test_each_failure_in_a_few_lines_with_the_assertion_and_the_end_of_its_message(
        tmp_path: Path) -> None:
    path = tmp_path / "junit-1.xml"
    path.write_text(JUNIT.format(lines="\n".join(f"E   check {n}: pass" for n in range(40))))
    lines = summary([path, tmp_path / "missing.xml"])
    assert lines[0] == "-- failure: tests.e2e.test_hil::test_battery (12.3 s)"
    body = lines[1:lines.index("-- error: tests.b::test_setup (0.2 s)")]
    assert body[0] == "   E   AssertionError: the battery failed"
    assert "   E   [...]" in body and body[-2] == "   E   assert 1 == 0"
    assert body[-1] == "   tests/e2e/test_hil.py:50: AssertionError"
    assert len(body) == LINES_PER_TEST + 2
    assert "test_ok" not in "\n".join(lines)
    assert "   fixture broke" in lines and lines[-1].startswith(f"{tmp_path}/missing.xml")
