"""nginx's JSON access log (``chatsite_json``) beside the app's JSON ``stream ended`` line: real
nginx in front of a real Daphne writing JSON, joined on the request id as docs/monitoring.md
joins them with jq (here in Python: the tests do not need jq).

The shipped sites write the JSON log only once its access_log line is uncommented; these tests
uncomment that one line (an ``edit``) and change nothing else.
"""

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from assistant.benchmarking.ports import free_port
from assistant.services.api_keys import key_create
from deploy.loopback_stack import Edit, nginx_args, render
from tests.support import ChatClient, LiveServer, NginxServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SITE = "chatsite.conf"
SPLIT_SITE = "chatsite-split.conf"
SERVERS_SITE = "chatsite-servers.conf"
SHIPPED_LINE = "\n    # access_log /var/log/nginx/chatsite.access.json.log chatsite_json;"
NGINX_FIELDS = [
    *("time", "request_id", "remote_addr", "method", "uri", "status", "bytes", "request_time"),
    *("upstream_connect_time", "upstream_header_time", "upstream_response_time"),
    *("upstream_addr", "upstream_status", "user_agent"),
]


def json_log_on(site: str, path: Path) -> Edit:
    """The site's JSON access_log line, uncommented, writing to ``path``."""
    return (site, SHIPPED_LINE, f"\n    access_log {path} chatsite_json;")


@pytest.mark.parametrize("site_file", [SITE, SPLIT_SITE, SERVERS_SITE])
def test_nginx_accepts_the_json_access_log(
    nginx_binary: str, tmp_path: Path, site_file: str
) -> None:
    """`nginx -t` passes, without a warning, with the JSON access log switched on."""
    edits = [json_log_on(site_file, tmp_path / "access.json.log")]
    main = render(
        tmp_path,
        site_file,
        workers=[free_port(), free_port()],
        port=free_port(),
        edits=edits,
        uvicorn_workers=[free_port()] if site_file == SERVERS_SITE else [],
    )
    result = subprocess.run(
        [*nginx_args(nginx_binary, main), "-t"], capture_output=True, text=True, timeout=30
    )
    output = result.stdout + result.stderr + (tmp_path / "error.log").read_text()
    assert result.returncode == 0, output
    assert "[warn]" not in output and "[emerg]" not in output, output


@pytest.fixture(scope="module")
def worker(daphne_factory) -> LiveServer:
    return daphne_factory(CHATSITE_LOG_FORMAT="json")


@pytest.fixture(scope="module")
def json_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nginx-json") / "access.json.log"


@pytest.fixture(scope="module")
def site(nginx_factory, worker: LiveServer, json_log: Path) -> NginxServer:
    return nginx_factory(SITE, [worker.port], [json_log_on(SITE, json_log)])


def nginx_line(json_log: Path, request_id: str) -> dict[str, Any]:
    """nginx's JSON line for ``request_id`` (written when the response has ended)."""

    def find() -> dict[str, Any] | None:
        if not json_log.exists():
            return None
        lines = [json.loads(line) for line in json_log.read_text().splitlines()]
        return next((o for o in lines if o["request_id"] == request_id), None)

    return wait_for(find)


def app_line(worker: LiveServer, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for line in worker.log().splitlines():
            if line.startswith("{"):
                found = json.loads(line)
                if found["message"] == "stream ended" and found["request_id"] == request_id:
                    return found
        return None

    return wait_for(find)


def assert_joined(nginx: dict[str, Any], app: dict[str, Any], uri: str) -> None:
    """The two lines of one request, as the jq join in docs/monitoring.md pairs them."""
    assert list(nginx) == NGINX_FIELDS
    assert (nginx["method"], nginx["uri"], nginx["status"]) == ("POST", uri, 200)
    assert nginx["upstream_status"] == "200" and nginx["bytes"] > 0
    assert isinstance(nginx["request_time"], float) and nginx["request_time"] >= 0
    for name in ("upstream_connect_time", "upstream_header_time", "upstream_response_time"):
        assert float(nginx[name]) >= 0, (name, nginx[name])
    assert app["outcome"] == "ok" and app["tokens"] == 3
    assert isinstance(app["server_ttft_ms"], float) and app["server_ttft_ms"] >= 0


def test_a_page_answer_joins_nginx_and_the_app_on_its_request_id(
    site: NginxServer, worker: LiveServer, json_log: Path
) -> None:
    """Without an id of its own, the request gets nginx's $request_id: the response's
    X-Request-ID, nginx's JSON line and the app's ``stream ended`` line all carry it, and the
    join has nginx's upstream_header_time beside the app's server_ttft_ms."""
    client = ChatClient(site)
    try:
        response = client.raw({"message": "[scripted tokens=3 ttft_ms=0] hi"})
        assert response.status == 200
        request_id = response.header("x-request-id")
        assert request_id and list(response.events())[-1].event == "done"
    finally:
        client.close()
    assert_joined(
        nginx_line(json_log, request_id), app_line(worker, request_id), "/api/chat/stream"
    )


def test_an_api_completion_joins_on_the_callers_request_id(
    site: NginxServer, worker: LiveServer, json_log: Path
) -> None:
    """An API client's own X-Request-ID is kept by nginx and the app alike."""
    _, key = key_create(name="logs", classroom=None, created_by=None)
    request_id = "api-client-id-0001"
    body = {
        "model": "chatsite",
        "stream": True,
        "messages": [{"role": "user", "content": "[scripted tokens=3 ttft_ms=0] hi"}],
    }
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": request_id}
    with httpx.stream(
        "POST", f"{site.url}/v1/chat/completions", json=body, headers=headers, timeout=20
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-request-id"] == request_id
        response.read()
    app = app_line(worker, request_id)
    assert app["path"] == "api"
    assert_joined(nginx_line(json_log, request_id), app, "/v1/chat/completions")
