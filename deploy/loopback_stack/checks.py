"""``check``: the guide's curl checks, then what a user and an operator would look at.

The guide's checks (ready, metrics, the dashboard's redirect, one curl stream) show that the site
answers; they would pass with one worker, no Redis or Secure cookies a browser drops on plain
HTTP. So the check goes on: several students with sessions of their own, every worker used
behind nginx, stream records in PostgreSQL, keys under the stack's prefix in Redis, metrics
shared between the workers, static files from STATIC_ROOT, the staff dashboard after a login.
"""

import json
import re
from collections.abc import Sequence
from http.client import HTTPConnection
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from assistant.benchmarking.frames import SSEEvent, SSEParser

from .client import SiteClient, chat_body
from .layout import STATIC_DIR
from .redis_db import redis_keys
from .report import eventually, expect, say

if TYPE_CHECKING:
    from .stack import LoopbackStack


def check(stack: "LoopbackStack") -> dict[str, Any]:
    """The guide's checks, then what a user and an operator would look at. Raises
    ``StackError`` naming the first thing that is wrong; returns what it measured."""
    found = guide_checks(stack)
    client = SiteClient(stack.url, stack.port)
    # Four more students, each with a session of their own.
    for number in range(4):
        cookies = client.page_cookies()
        found["cookies"] = sorted(cookies)
        with client.request("POST", "/api/chat/stream", chat_body(number), cookies) as resp:
            expect(resp.status == 200, f"chat stream answered {resp.status}")
            kind = resp.getheader("Content-Type", "")
            expect(kind.startswith("text/event-stream"), f"chat stream is {kind}")
            expect(resp.getheader("Content-Encoding") is None, "chat stream is compressed")
            expect_answer(sse_events(resp.read()), "the chat stream")
    found["upstreams"] = upstreams_used(stack)
    found["stream_records"] = eventually(lambda: stream_records(stack))
    found["redis_keys"] = len(redis_keys(stack.name))
    expect(found["redis_keys"] > 0, f"no Redis key starts with {stack.name}:")
    found["streams_counted"] = eventually(lambda: metrics_shared(stack.workers))
    static_file(client)
    found["staff_dashboard"] = client.staff_dashboard(stack.staff_password())
    pruned = stack.manage("prune")
    expect("would delete" in pruned, f"manage prune --dry-run said {pruned!r}")
    found["postgres_connections"] = int(
        stack.sql(
            "SELECT count(*) FROM pg_stat_activity"
            f" WHERE datname = '{stack.name}' AND pid <> pg_backend_pid()"
        )
    )
    say(f"check passed: {json.dumps(found)}")
    return found


def guide_checks(stack: "LoopbackStack") -> dict[str, Any]:
    """The checks of docs/deploy.md, its curl commands as written."""
    ready = stack.shell("ready").strip()
    expect(ready.endswith(" 200"), f"GET /readyz answered {ready!r}")
    body = json.loads(ready.rsplit(" ", 1)[0])
    expect(body["status"] == "ready", f"GET /readyz says {body}")
    expect(stack.shell("metrics").strip() == "200", "GET /metrics is not 200")
    dashboard = stack.shell("dashboard").strip()
    login = f"302 {stack.url}/admin/login/?next=/dashboard/"
    expect(dashboard == login, f"GET /dashboard/ answered {dashboard!r}, not {login!r}")
    expect_answer(sse_events(stack.shell("stream").encode()), "curl's stream")
    return {"ready": body["checks"]}


def sse_events(raw: bytes) -> list[SSEEvent]:
    """The events of a whole event stream."""
    return SSEParser().feed(raw)


def expect_answer(events: Sequence[SSEEvent], what: str) -> None:
    names = [event.event for event in events]
    expect(bool(names) and names[0] == "meta", f"{what} did not start with meta: {names}")
    expect("token" in names, f"{what} has no token: {names}")
    expect(names[-1] == "done", f"{what} did not end with done: {names}")


def stream_records(stack: "LoopbackStack") -> int:
    """Each stream's timings are in PostgreSQL (written once it has ended)."""
    count = int(stack.sql("SELECT count(*) FROM assistant_streamrecord"))
    expect(count >= 5, f"{count} stream records, not 5")
    return count


def upstreams_used(stack: "LoopbackStack") -> list[str]:
    """Every worker answered through nginx (its access log's up= field)."""
    log = (stack.layout.nginx / "access.log").read_text()
    used = sorted(set(re.findall(r" up=127\.0\.0\.1:(\d+) ", log)))
    wanted = sorted(str(port) for port in stack.workers)
    expect(used == wanted, f"nginx used workers {used}, not {wanted}")
    return used


def metric_total(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text exposition."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def metrics_shared(workers: Sequence[int]) -> float:
    """Each worker's own /metrics (as Prometheus scrapes it) counts every worker's streams:
    the shared PROMETHEUS_MULTIPROC_DIR of the units."""
    totals = []
    for port in workers:
        connection = HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            resp = connection.getresponse()
            text = resp.read().decode()
        finally:
            connection.close()
        expect(resp.status == 200, f"worker {port}: /metrics answered {resp.status}")
        totals.append(metric_total(text, "ai_streams_total"))
    expect(len(set(totals)) == 1, f"the workers count different totals: {totals}")
    expect(totals[0] >= 5, f"the workers counted {totals[0]} streams, not 5")
    return totals[0]


def static_file(client: SiteClient) -> None:
    """nginx serves /static/ from what collectstatic put in STATIC_ROOT."""
    name = "chatsite/chat.js"
    with client.request("GET", f"/static/{name}") as resp:
        body = resp.read()
        expect(resp.status == 200, f"/static/{name} answered {resp.status}")
        # The app's middleware sends a Referrer-Policy; nginx alone does not.
        expect(resp.getheader("Referrer-Policy") is None, f"/static/{name} came from the app")
    expect(body == (STATIC_DIR / name).read_bytes(), f"/static/{name} differs from the source")
