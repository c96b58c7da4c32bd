"""``manage.py ttft_doctor`` against the real nginx in front of real Daphne workers: the shipped
site passes every check, and each deliberately broken variant fails the check of its own layer
and no other.

The workers ping after 2 s of silence (CHATSITE_PING_INTERVAL), so the idle check waits 2.25 s.
"""

import datetime
import ipaddress
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import CommandError, call_command

from assistant.benchmarking.ports import free_port
from assistant.models import ApiKey
from assistant.services.api_keys import key_create
from deploy.loopback_stack import Edit
from tests.support import LiveServer, NginxServer

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
SITE = "chatsite.conf"
SSE_SNIPPET = "snippets/chatsite-sse.conf"
SERVER_SNIPPET = "snippets/chatsite-server.conf"
PROXY_SNIPPET = "snippets/chatsite-proxy.conf"

BUFFERING_ON = (SSE_SNIPPET, "proxy_buffering off;", "proxy_buffering on;")
ACCEL_IGNORED = (
    SSE_SNIPPET,
    "proxy_buffering off;",
    "proxy_buffering on;\nproxy_ignore_headers X-Accel-Buffering;",
)
HTTP_10 = (PROXY_SNIPPET, "proxy_http_version 1.1;", "proxy_http_version 1.0;")
STREAM_GZIPPED = [
    (SSE_SNIPPET, "gzip off;", "gzip on;"),
    (SERVER_SNIPPET, "gzip_types ", "gzip_types text/event-stream "),
]
CONNECTION_CLOSE = (PROXY_SNIPPET, 'proxy_set_header Connection "";', "")
SHORT_READ_TIMEOUT = (SSE_SNIPPET, "proxy_read_timeout 1h;", "proxy_read_timeout 1s;")
# Where a test adds a TLS listener to the site's server block.
SERVER_NAME = "server_name chat.example.org;\n    access_log"


@pytest.fixture(scope="module")
def workers(daphne_factory: Callable[..., LiveServer]) -> list[LiveServer]:
    return [daphne_factory(CHATSITE_PING_INTERVAL="2") for _ in range(2)]


@pytest.fixture
def key() -> str:
    return key_create(name="doctor", classroom=None, created_by=None)[1]


def doctor(*args: str) -> tuple[dict[str, Any], CommandError | None]:
    """The doctor's JSON report, and the error it exits with (None: every check passed)."""
    out = StringIO()
    try:
        call_command("ttft_doctor", *args, "--json", stdout=out)
    except CommandError as error:
        return json.loads(out.getvalue()), error
    return json.loads(out.getvalue()), None


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {row["id"]: row["verdict"] for row in report["checks"]}


def failed(report: dict[str, Any]) -> set[str]:
    return {row["id"] for row in report["checks"] if row["verdict"] == "fail"}


def site_with(
    nginx_factory: Any, workers: list[LiveServer], edits: Sequence[Edit] = ()
) -> NginxServer:
    return nginx_factory(SITE, [w.port for w in workers], edits=edits)


def test_the_shipped_site_passes_every_check(
    nginx_factory: Any, workers: list[LiveServer], key: str
) -> None:
    """Through the shipped config and directly, frames arrive as sent; every check passes
    (HTTP/2 is skipped: plain HTTP)."""
    site = site_with(nginx_factory, workers)
    report, error = doctor(site.url, "--direct", workers[0].url, "--key", key)
    assert error is None, report
    assert report["ok"] is True
    assert set(verdicts(report).values()) == {"pass", "skip"}, report
    assert verdicts(report)["http2"] == "skip"
    rows = {row["id"]: row for row in report["checks"]}
    assert rows["proxy_buffering"]["figures"]["proxy_bare_held_ms"] < 150
    assert rows["upstream_http"]["proxy"] == "HTTP/1.1"
    assert rows["idle_timeout"]["figures"]["silence_s"] == 2.25
    assert rows["direct"]["verdict"] == "pass"


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        # Over HTTP/1.1 nginx passes each chunk on even while it buffers (tests/deploy/
        # test_nginx.py::test_what_holds_the_stream_back); an HTTP/1.0 upstream is what makes
        # proxy_buffering on hold frames back, so both are named.
        pytest.param(
            [BUFFERING_ON, HTTP_10], {"proxy_buffering", "upstream_http"}, id="proxy_buffering_on"
        ),
        pytest.param(
            [ACCEL_IGNORED, HTTP_10],
            {"headers", "first_byte", "proxy_buffering", "accel_header", "upstream_http"},
            id="x_accel_buffering_ignored",
        ),
        pytest.param([HTTP_10], {"upstream_http"}, id="http_1.0_upstream"),
        pytest.param(STREAM_GZIPPED, {"compression"}, id="gzip_on_event_streams"),
        pytest.param([SHORT_READ_TIMEOUT], {"idle_timeout"}, id="short_proxy_read_timeout"),
    ],
)
def test_each_broken_variant_is_named_for_its_layer(
    nginx_factory: Any,
    workers: list[LiveServer],
    key: str,
    edits: list[Edit],
    expected: set[str],
) -> None:
    """The checks that fail are exactly the broken layer's, each blaming the proxy (the worker
    measured directly passes), with a fix; the doctor exits non-zero."""
    site = site_with(nginx_factory, workers, edits)
    report, error = doctor(site.url, "--direct", workers[0].url, "--key", key)
    assert error is not None and error.returncode == 1
    assert failed(report) == expected, report
    for row in report["checks"]:
        if row["verdict"] == "fail":
            assert row["layer"] == "proxy" and row["fix"], row


def test_closing_worker_connections_is_a_warning(
    nginx_factory: Any, workers: list[LiveServer], key: str
) -> None:
    """Without ``proxy_set_header Connection ""`` nginx tells the worker to close after each
    request: nothing is held back, so it is a warning, and the doctor still exits 0."""
    site = site_with(nginx_factory, workers, [CONNECTION_CLOSE])
    report, error = doctor(site.url, "--key", key, "--skip", "idle_timeout")
    assert error is None and report["ok"], report
    row = next(row for row in report["checks"] if row["id"] == "upstream_http")
    assert (row["verdict"], row["proxy"]) == ("warn", "HTTP/1.1, Connection: close"), row
    assert "Connection" in row["fix"]


def test_the_idle_cut_is_timed(nginx_factory: Any, workers: list[LiveServer], key: str) -> None:
    """A 1 s proxy_read_timeout cuts the probe after about 1 s of silence, and the finding
    says so beside the app's ping interval."""
    site = site_with(nginx_factory, workers, [SHORT_READ_TIMEOUT])
    report, _ = doctor(site.url, "--key", key, "--skip", "http2")
    row = next(row for row in report["checks"] if row["id"] == "idle_timeout")
    assert 0.5 <= row["figures"]["cut_after_s"] < 2.5, row
    assert "ping interval (2 s)" in row["finding"]
    assert "proxy_read_timeout" in row["fix"]


def test_the_command_line_gates_a_deploy(
    nginx_factory: Any, workers: list[LiveServer], key: str
) -> None:
    """As an operator runs it: a table on the terminal, exit 0 when every check passes and 1
    when one fails, naming it."""
    good = site_with(nginx_factory, workers)
    bad = site_with(nginx_factory, workers, STREAM_GZIPPED)

    def run(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "manage.py",
                "ttft_doctor",
                url,
                "--key",
                key,
                "--skip",
                "idle_timeout",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    passed, broken = run(good.url), run(bad.url)
    assert passed.returncode == 0, passed.stderr
    assert "Every check passed." in passed.stdout
    assert broken.returncode == 1
    line = next(line for line in broken.stdout.splitlines() if line.startswith("compression"))
    assert line.split()[-1] == "fail" and "gzip" in line
    assert "fix: gzip off;" in broken.stdout
    assert "compression" in broken.stderr


def test_without_a_key_a_temporary_one_is_made_and_deleted(
    nginx_factory: Any, workers: list[LiveServer]
) -> None:
    """Run on the server with no key: it makes one in the site's database and deletes it."""
    site = site_with(nginx_factory, workers)
    report, error = doctor(site.url, "--skip", "idle_timeout")
    assert error is None and report["ok"], report
    assert not ApiKey.objects.exists()


def test_a_bad_key_fails_the_first_check(nginx_factory: Any, workers: list[LiveServer]) -> None:
    site = site_with(nginx_factory, workers)
    report, error = doctor(site.url, "--key", "csk-abcdefghij-" + "x" * 43)
    assert error is not None
    assert [row["id"] for row in report["checks"]] == ["reach"]
    assert "401" in report["checks"][0]["finding"]


# --- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.mark.parametrize(("listen", "h2"), [("ssl http2", "pass"), ("ssl", "fail")])
def test_http2_over_tls(
    nginx_factory: Any,
    workers: list[LiveServer],
    key: str,
    certificate: tuple[Path, Path],
    listen: str,
    h2: str,
) -> None:
    """Served over TLS, the site offers HTTP/2 as shipped (``listen 443 ssl http2``); without
    it the HTTP/2 check fails, and every other check still passes over TLS."""
    cert, private = certificate
    port = free_port()
    tls = (
        SITE,
        SERVER_NAME,
        f"server_name chat.example.org;\n    listen 127.0.0.1:{port} {listen};\n"
        f"    ssl_certificate {cert};\n    ssl_certificate_key {private};\n    access_log",
    )
    site_with(nginx_factory, workers, [tls])
    url = f"https://127.0.0.1:{port}"
    report, _ = doctor(url, "--key", key, "--cafile", str(cert), "--skip", "idle_timeout")
    rows = {row["id"]: row for row in report["checks"]}
    assert rows["http2"]["verdict"] == h2, report
    assert rows["http2"]["proxy"] == ("h2" if h2 == "pass" else "http/1.1")
    assert failed(report) == ({"http2"} if h2 == "fail" else set()), report


def test_a_worker_that_does_not_answer_fails_the_gate(
    nginx_factory: Any, workers: list[LiveServer], key: str
) -> None:
    """A --direct that answers nothing: the site's checks pass, but nothing could tell the
    layers apart, so the gate fails on the direct row and names the address."""
    site = site_with(nginx_factory, workers)
    nowhere = f"http://127.0.0.1:{free_port()}"
    report, error = doctor(site.url, "--direct", nowhere, "--key", key, "--skip", "idle_timeout")
    assert error is not None
    assert failed(report) == {"direct"}, report
    row = next(row for row in report["checks"] if row["id"] == "direct")
    assert nowhere in row["finding"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["http://127.0.0.1:9", "--skip", "idle_timeout,nope"], "unknown check nope"),
        (["http://127.0.0.1:9", "--skip", "reach"], "unknown check reach"),
        (["chat.example.org"], "not an http:// or https:// URL"),
        (["http://127.0.0.1:9", "--direct", "127.0.0.1:8001"], "not an http:// or https:// URL"),
    ],
)
def test_bad_arguments_are_refused_before_any_probe(args: list[str], said: str) -> None:
    with pytest.raises(CommandError, match=said):
        call_command("ttft_doctor", *args)
