"""The client's address behind a trusted proxy: Forwarded (RFC 7239) and X-Forwarded-For."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from ruseon_appliance.access.client import (
    MalformedHeader,
    client_address,
    forwarded_for,
    parse_forwarded,
    x_forwarded_for,
)

PROXIES = (ipaddress.ip_network("127.0.0.2/32"), ipaddress.ip_network("10.0.0.0/8"),
           ipaddress.ip_network("fd00::/8"))


def through_proxy(**headers: str) -> str:
    return client_address("127.0.0.2", {k.replace("_", "-"): v for k, v in headers.items()},
                          PROXIES)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # RFC 7239's own examples (§4, §7.4).
        ('for="_gazonk"', "127.0.0.2"),
        ('For="[2001:db8:cafe::17]:4711"', "2001:db8:cafe::17"),
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ("for=192.0.2.43, for=198.51.100.17", "198.51.100.17"),
        # The right-most address that is not a trusted proxy; the left end may be forged.
        ("for=198.51.100.99, for=192.0.2.43, for=10.1.2.3", "192.0.2.43"),
        ('for=192.0.2.43, for="[fd00::5]:80", for=10.1.2.3', "192.0.2.43"),
        ('for="192.0.2.43:1234"', "192.0.2.43"),
        ('for="[::ffff:192.0.2.43]"', "192.0.2.43"),
        ("for=192.0.2.43 ; proto=https , for=10.0.0.9", "192.0.2.43"),
        ('for="\\192.0.2.43"', "192.0.2.43"),  # a quoted-pair is the character itself
        # Every hop a trusted proxy: the client is on a proxy's host; the first one it is.
        ("for=10.0.0.7, for=10.0.0.8", "10.0.0.7"),
        # A hop that hides its address: the proxy's own (safe) address.
        ("for=unknown, for=10.0.0.8", "127.0.0.2"),
        ('for=192.0.2.43, for="_hidden:_port"', "127.0.0.2"),
        # Malformed: the proxy's address.
        ("for=2001:db8::1", "127.0.0.2"),  # IPv6 must be quoted and bracketed
        ('for="2001:db8::1"', "127.0.0.2"),
        ('for="[2001:db8::1"', "127.0.0.2"),
        ('for="[2001:db8::1]:99999x"', "127.0.0.2"),
        ("for=192.0.2.43;for=192.0.2.44", "127.0.0.2"),  # a parameter twice in one element
        ('for="192.0.2.43', "127.0.0.2"),
        ("for=", "127.0.0.2"),
        ("for", "127.0.0.2"),
        ("for=pi.local", "127.0.0.2"),
        ("for=192.0.2.43 junk", "127.0.0.2"),
        ("for=300.1.2.3", "127.0.0.2"),
    ],
)
def test_forwarded(header: str, expected: str) -> None:
    assert through_proxy(Forwarded=header) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("198.51.100.7, 10.1.1.1", "198.51.100.7"),
        ("203.0.113.9, 198.51.100.7, 10.1.1.1", "198.51.100.7"),
        ("2001:db8::7", "2001:db8::7"),
        ("[2001:db8::7]:51000", "2001:db8::7"),
        ("198.51.100.7:51000", "198.51.100.7"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("unknown, 10.1.1.1", "127.0.0.2"),
        ("198.51.100.7,, 10.1.1.1", "127.0.0.2"),
        ("198.51.100.7, evil", "127.0.0.2"),
        ("not an address", "127.0.0.2"),
        ("", "127.0.0.2"),
    ],
)
def test_x_forwarded_for(header: str, expected: str) -> None:
    assert through_proxy(X_Forwarded_For=header) == expected


def test_forwarded_comes_first_and_without_for_gives_way_to_x_forwarded_for() -> None:
    assert through_proxy(Forwarded="for=192.0.2.1", X_Forwarded_For="192.0.2.2") == "192.0.2.1"
    assert through_proxy(Forwarded="proto=https", X_Forwarded_For="192.0.2.2") == "192.0.2.2"
    # A malformed Forwarded is not overruled by an X-Forwarded-For beside it.
    assert through_proxy(Forwarded="for=[x", X_Forwarded_For="192.0.2.2") == "127.0.0.2"


def test_headers_from_an_untrusted_peer_are_ignored() -> None:
    headers = {"X-Forwarded-For": "192.0.2.1", "Forwarded": "for=192.0.2.1"}
    assert client_address("127.0.0.3", headers, PROXIES) == "127.0.0.3"
    assert client_address("192.168.1.5", headers, PROXIES) == "192.168.1.5"
    assert client_address("127.0.0.2", headers, ()) == "127.0.0.2"
    assert client_address(None, headers, PROXIES) == ""
    assert client_address("", headers, PROXIES) == ""
    assert client_address("not-an-ip", headers, PROXIES) == "not-an-ip"


def test_peer_forms_inside_a_trusted_network() -> None:
    headers = {"X-Forwarded-For": "192.0.2.1"}
    assert client_address("::ffff:127.0.0.2", headers, PROXIES) == "192.0.2.1"
    assert client_address("fd00::1", headers, PROXIES) == "192.0.2.1"
    assert client_address("fe80::1%eth0", headers, (ipaddress.ip_network("fe80::/10"),)) == (
        "192.0.2.1")


def test_several_header_lines_are_one_list() -> None:
    headers = CIMultiDict([("X-Forwarded-For", "203.0.113.9"),
                           ("X-Forwarded-For", "198.51.100.7, 10.0.0.1")])
    assert client_address("127.0.0.2", headers, PROXIES) == "198.51.100.7"
    headers = CIMultiDict([("Forwarded", "for=203.0.113.9"), ("Forwarded", "for=10.0.0.1")])
    assert client_address("127.0.0.2", headers, PROXIES) == "203.0.113.9"


def test_the_parsers_say_what_they_found() -> None:
    assert parse_forwarded('for="[::1]:80";by=_x, proto=https') == [
        {"for": "[::1]:80", "by": "_x"}, {"proto": "https"}]
    assert forwarded_for("proto=https") == []
    assert forwarded_for("for=unknown, proto=https") == [None, None]
    assert x_forwarded_for(" ") == []
    with pytest.raises(MalformedHeader):
        parse_forwarded('for="a\x01"')
    with pytest.raises(MalformedHeader):
        x_forwarded_for("1.2.3.4, ")


@given(st.text(max_size=60), st.text(max_size=60))
def test_any_header_gives_the_peer_or_an_address(forwarded: str, xff: str) -> None:
    result = client_address("127.0.0.2", {"Forwarded": forwarded, "X-Forwarded-For": xff},
                            PROXIES)
    assert result == "127.0.0.2" or ipaddress.ip_address(result)
