"""The one logging setup: key=value context from upper-case ``extra`` keys."""

from __future__ import annotations

import io
import logging

from ruseon_appliance.logs import KeyValueFormatter, RateLimit, context_fields, setup_logging


def test_context_fields_print_as_key_value_and_levels_apply() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KeyValueFormatter(with_time=False))
    setup_logging("info", handler)
    log = logging.getLogger("ruseon.test")
    log.debug("hidden")
    log.info("viewer joined", extra={"SESSION_ID": "abc", "REMOTE_ADDR": "127.0.0.1:5000",
                                     "EVENT": "session start"})
    assert stream.getvalue().splitlines() == [
        'INFO ruseon.test: viewer joined event="session start" remote_addr=127.0.0.1:5000 '
        "session_id=abc"
    ]


def test_third_party_chatter_is_kept_to_warnings() -> None:
    setup_logging("info", logging.NullHandler())
    assert logging.getLogger("aioice").getEffectiveLevel() == logging.WARNING
    setup_logging("debug", logging.NullHandler())
    assert logging.getLogger("aioice").getEffectiveLevel() == logging.DEBUG


def test_context_fields_ignore_standard_attributes() -> None:
    record = logging.makeLogRecord({"msg": "x", "EVENT": "e", "lower": 1})
    assert context_fields(record) == {"EVENT": "e"}


def test_rate_limit_says_yes_once_per_interval() -> None:
    now = [1000.0]
    limit = RateLimit(60.0, clock=lambda: now[0])
    assert limit.ready()  # the first failure is always logged
    now[0] += 59.0
    assert not limit.ready()
    now[0] += 1.0
    assert limit.ready()  # a full interval since the last yes
    assert not limit.ready()
