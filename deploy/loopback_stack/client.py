"""Requests through the stack's nginx, sent as the page and a staff member's browser send them.

The checks talk HTTP themselves rather than through a client library's cookie jar because what
they check is the exchange: which cookies come back and with which flags, the CSRF token in the
header and the same-origin ``Origin``, the headers of a static file, a login's redirect.
"""

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.client import HTTPConnection, HTTPResponse
from http.cookies import SimpleCookie
from urllib.parse import urlencode

from .report import expect

STAFF = {"username": "loopback-staff", "email": "staff@example.org"}


class SiteClient:
    """HTTP to 127.0.0.1:``port``, the site whose public address is ``url``."""

    def __init__(self, url: str, port: int) -> None:
        self.url = url
        self.port = port

    @contextmanager
    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        cookies: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[HTTPResponse]:
        """One request through nginx, as the page would send it (cookies, CSRF token)."""
        all_headers = dict(headers or {})
        if cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
            if method == "POST" and "csrftoken" in cookies:
                all_headers.setdefault("X-CSRFToken", cookies["csrftoken"])
                all_headers.setdefault("Origin", self.url)
        if body is not None:
            all_headers.setdefault("Content-Type", "application/json")
        connection = HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=all_headers)
            yield connection.getresponse()
        finally:
            connection.close()

    def page_cookies(self) -> dict[str, str]:
        """GET / hands out the session and the CSRF token, neither of them Secure on plain
        HTTP (a browser would drop a Secure cookie here, and every question would fail CSRF)."""
        with self.request("GET", "/") as resp:
            expect(resp.status == 200, f"GET / answered {resp.status}")
            resp.read()
            jar = _cookies(resp)
        expect({"sessionid", "csrftoken"} <= set(jar), f"GET / set {sorted(jar)}")
        for name in ("sessionid", "csrftoken"):
            expect(not jar[name]["secure"], f"{name} is Secure on plain HTTP (CHATSITE_TLS?)")
        return {name: morsel.value for name, morsel in jar.items()}

    def staff_dashboard(self, password: str) -> int:
        """The account of `createsuperuser` logs in through nginx and sees the dashboard."""
        with self.request("GET", "/admin/login/?next=/dashboard/") as resp:
            page = resp.read().decode()
            jar = _cookies(resp)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        expect(token is not None and "csrftoken" in jar, "the login page has no CSRF token")
        assert token is not None
        cookies = {"csrftoken": jar["csrftoken"].value}
        form = urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": STAFF["username"],
                "password": password,
                "next": "/dashboard/",
            }
        ).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": self.url}
        with self.request("POST", "/admin/login/", form, cookies, headers) as resp:
            resp.read()
            expect(resp.status == 302, f"logging in answered {resp.status}")
            expect(resp.getheader("Location") == "/dashboard/", "logging in went elsewhere")
            for header in resp.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        cookies = {name: morsel.value for name, morsel in jar.items()}
        with self.request("GET", "/dashboard/", cookies=cookies) as resp:
            resp.read()
            expect(resp.status == 200, f"the staff dashboard answered {resp.status}")
            return resp.status


def _cookies(resp: HTTPResponse) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in resp.headers.get_all("Set-Cookie") or []:
        jar.load(header)
    return jar


def chat_body(number: int) -> bytes:
    """A question to the scripted engine: three tokens, quickly."""
    message = f"[scripted tokens=3 ttft_ms=5 itl_ms=5] Question {number}"
    return json.dumps({"message": message, "conversation": None}).encode()
