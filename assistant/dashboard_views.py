"""The staff dashboard: live TTFT per serving path, the split control, the breaker's log.

Every figure comes from the shared database (each Daphne worker stores its streams' records
there), so a dashboard served by any worker shows all of them. Updates are pushed as
Server-Sent Events, one ``snapshot`` a second, built at most once a second per window and
process however many staff are watching.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone, translation
from django.utils.translation import gettext, pgettext
from django.views.decorators.http import require_GET, require_POST

from assistant import errors, http, sse
from assistant.dashboard_strings import dashboard_strings
from assistant.db import run_cache, run_db, run_db_write
from assistant.engines import describe_serving
from assistant.errors import Rejected
from assistant.models import BreakerEvent
from assistant.services.background import draining
from assistant.services.dashboard import WINDOWS, traffic_snapshot, window_chosen
from assistant.services.serving import split_change, split_load
from assistant.services.teaching import staff_of_session

#: Seconds between two snapshots pushed to a dashboard.
PUSH_INTERVAL_S = 1.0
#: How long a snapshot is reused (long windows hold many records and change slowly).
SNAPSHOT_TTL_S = {"5m": 1.0, "1h": 2.0, "24h": 2.0}
EVENTS_SHOWN = 20

type AsyncView = Callable[..., Awaitable[HttpResponseBase]]


def staff_required(view: AsyncView) -> AsyncView:
    """Anonymous visitors go to the login page (API calls get 401), non-staff get 403."""

    @wraps(view)
    async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        user = await request.auser()
        is_api = request.path.startswith("/dashboard/api/") or request.path.endswith("/events")
        if not user.is_authenticated:
            if is_api:
                return http.api_error(errors.LOGIN_REQUIRED)
            return redirect_to_login(request.get_full_path())
        if not user.is_staff:
            if is_api:
                return http.api_error(errors.STAFF_ONLY)
            return render(request, "assistant/forbidden.html", status=403)
        return await view(request, *args, **kwargs)

    return wrapper


def _window(request: HttpRequest) -> str:
    return window_chosen(request.GET.get("window"), "5m")


def dashboard_snapshot(*, window: str) -> dict[str, Any]:
    """Synchronous (ORM): everything the dashboard shows for ``window``, cached for a second."""
    key = f"chatsite:dashboard:{window}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    split = split_load()
    config = settings.CHATSITE_BREAKER
    events = BreakerEvent.objects.all()[:EVENTS_SHOWN]
    snapshot = {
        "window": window,
        "window_s": WINDOWS[window],
        "generated_at": timezone.now().isoformat(),
        "baseline": split.baseline,
        "candidate": split.candidate,
        **traffic_snapshot(
            window_s=WINDOWS[window], baseline=split.baseline, candidate=split.candidate
        ),
        "split": split.describe(),
        # The model process (embedded engine): up or restarting, and how often it restarted.
        "engines": describe_serving(),
        "breaker": {
            "state": split.breaker,
            "since": split.breaker_since.isoformat() if split.breaker_since else None,
            "config": {
                "window_s": config["WINDOW_S"],
                "min_samples": config["MIN_SAMPLES"],
                "p95_ratio": config["P95_RATIO"],
                "error_margin": config["ERROR_MARGIN"],
                "cooldown_s": config["COOLDOWN_S"],
                "half_open_percent": config["HALF_OPEN_PERCENT"],
            },
            "events": [
                {
                    "at": event.created_at.isoformat(),
                    "kind": event.kind,
                    "breaker": event.breaker,
                    "message": event.message,
                    "figures": event.figures,
                    "actor": event.actor,
                }
                for event in events
            ],
        },
    }
    cache.set(key, snapshot, timeout=SNAPSHOT_TTL_S[window])
    return snapshot


@require_GET
@staff_required
async def dashboard(request: HttpRequest) -> HttpResponseBase:
    """``/dashboard/``: the page; its data arrives from ``dashboard_events``."""
    # Each window's value (a code), its button's text and its title, in the page's language.
    windows = [
        ["5m", pgettext("time window button", "5m"), gettext("Last 5 minutes")],
        ["1h", pgettext("time window button", "1h"), gettext("Last 1 hour")],
        ["24h", pgettext("time window button", "24h"), gettext("Last 24 hours")],
    ]
    window = request.GET.get("window", "5m")
    context = {
        "events_url": "/dashboard/events",
        "split_url": "/dashboard/api/split",
        "windows": windows,
        "window": window if window in WINDOWS else "5m",
        "page_strings": dashboard_strings(),
    }
    return await run_db(_render_in, translation.get_language(), request, context)


def _render_in(language: str, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    """The dashboard page rendered in ``language``: a reader thread does not inherit the
    request's active language from the event loop's context."""
    with translation.override(language):
        return render(request, "assistant/dashboard.html", context)


@require_GET
@staff_required
async def dashboard_events(request: HttpRequest) -> HttpResponseBase:
    """``/dashboard/events?window=5m``: a ``snapshot`` event every second."""
    try:
        window = _window(request)
    except Rejected as rejected:
        return http.api_error(rejected.error)
    session_key = http.session_key(request.COOKIES)
    assert session_key is not None  # staff_required: a logged-in user has a session
    snapshots = _snapshots(window, session_key=session_key)
    response = StreamingHttpResponse(snapshots, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache, no-transform"
    response.headers["X-Accel-Buffering"] = "no"
    return response


async def _snapshots(window: str, *, session_key: str) -> AsyncIterator[bytes]:
    """A snapshot a second for as long as the viewer is staff: checked again every
    ``CHATSITE_DASHBOARD_RECHECK_S``, and a viewer logged out, deactivated or no longer staff
    gets a ``forbidden`` event and the end of the stream. A worker that drains ends it (the
    browser reconnects, to another worker, two seconds later)."""
    # A dropped connection is retried by the browser after two seconds.
    yield sse.encode_event("", event="hello", retry_ms=2000)
    loop = asyncio.get_running_loop()
    recheck_s = settings.CHATSITE_DASHBOARD["STAFF_RECHECK_S"]
    checked = loop.time()
    while not draining():
        if loop.time() - checked >= recheck_s:
            if await run_db(staff_of_session, session_key) is None:
                yield sse.encode_json_event(errors.STAFF_ONLY.payload(), event="forbidden")
                return
            checked = loop.time()
        snapshot = await run_db(dashboard_snapshot, window=window)
        yield sse.encode_event(json.dumps(snapshot), event="snapshot")
        await asyncio.sleep(PUSH_INTERVAL_S)


@require_GET
@staff_required
async def dashboard_snapshot_json(request: HttpRequest) -> HttpResponseBase:
    """``/dashboard/api/snapshot?window=5m``: the same snapshot, once."""
    try:
        window = _window(request)
    except Rejected as rejected:
        return http.api_error(rejected.error)
    snapshot = await run_db(dashboard_snapshot, window=window)
    return HttpResponse(json.dumps(snapshot), content_type="application/json")


@require_POST
@staff_required
async def split_update(request: HttpRequest) -> HttpResponseBase:
    """``POST /dashboard/api/split`` ``{"percent": 0-100, "mode": "auto"}``: change the split."""
    try:
        payload = json.loads(request.body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return http.api_error(errors.INVALID_JSON)
    if not isinstance(payload, dict):
        return http.api_error(errors.SPLIT_INVALID)
    percent, mode = payload.get("percent"), payload.get("mode")
    if percent is not None and (isinstance(percent, bool) or not isinstance(percent, int | float)):
        return http.api_error(errors.SPLIT_INVALID.with_message("percent must be a number."))
    if mode is not None and not isinstance(mode, str):
        return http.api_error(errors.SPLIT_INVALID.with_message("mode must be a string."))
    if percent is None and mode is None:
        return http.api_error(errors.SPLIT_INVALID.with_message("Send percent, mode or both."))
    user = await request.auser()
    try:
        split = await run_db_write(
            split_change,
            percent=float(percent) if percent is not None else None,
            mode=mode,
            actor=user.get_username(),
        )
    except Rejected as rejected:
        return http.api_error(rejected.error)
    await run_cache("delete_many", [f"chatsite:dashboard:{w}" for w in WINDOWS])
    return HttpResponse(json.dumps({"split": split.describe()}), content_type="application/json")
