"""The client's address: the peer, or what a trusted proxy says it saw, and nothing a client
could choose for itself."""

import pytest
from django.test import override_settings

from assistant.services.clients import UNKNOWN, client_address, scope_client

TRUSTED = {"TRUSTED_PROXIES": ["127.0.0.1", "::1", "10.0.0.0/8"]}


@pytest.fixture(autouse=True)
def _trusted_proxies(settings) -> None:
    settings.CHATSITE_CLIENTS = {**settings.CHATSITE_CLIENTS, **TRUSTED}


def test_a_direct_client_is_its_peer_whatever_it_claims() -> None:
    assert client_address("198.51.100.7", "1.2.3.4", "5.6.7.8") == "198.51.100.7"


def test_behind_a_trusted_proxy_the_forwarded_address_counts() -> None:
    assert client_address("127.0.0.1", "198.51.100.7", None) == "198.51.100.7"
    assert client_address("127.0.0.1", None, "198.51.100.7") == "198.51.100.7"
    assert client_address("127.0.0.1", None, None) == "127.0.0.1"


def test_a_chain_is_read_right_to_left_past_trusted_hops_only() -> None:
    # The client wrote 6.6.6.6 itself; its real address is what the first trusted hop saw.
    chain = "6.6.6.6, 198.51.100.7, 10.1.2.3"
    assert client_address("127.0.0.1", chain, None) == "198.51.100.7"
    # X-Forwarded-For wins over X-Real-IP: it carries the whole chain.
    assert client_address("127.0.0.1", "198.51.100.7", "10.9.9.9") == "198.51.100.7"


def test_a_garbled_entry_stops_at_the_proxy_that_wrote_it() -> None:
    assert client_address("127.0.0.1", "not-an-address", None) == "127.0.0.1"
    assert client_address("127.0.0.1", "garbage, 10.1.2.3", None) == "10.1.2.3"


def test_spellings_are_one_address() -> None:
    assert client_address("::ffff:198.51.100.7", None, None) == "198.51.100.7"
    assert client_address("::1", "[2001:db8::1]", None) == "2001:db8::1"
    assert client_address(None, "198.51.100.7", None) == UNKNOWN


@override_settings(CHATSITE_CLIENTS={"TRUSTED_PROXIES": []})
def test_with_no_trusted_proxy_headers_are_ignored() -> None:
    assert client_address("127.0.0.1", "198.51.100.7", None) == "127.0.0.1"


def test_an_asgi_scope_joins_repeated_headers_in_order() -> None:
    scope = {
        "client": ("127.0.0.1", 5000),
        "headers": [(b"x-forwarded-for", b"198.51.100.7"), (b"x-forwarded-for", b"10.0.0.2")],
    }
    assert scope_client(scope) == "198.51.100.7"
