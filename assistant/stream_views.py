"""The ``django`` serving path: the chat stream as an async Django view.

The same service layer as the Channels consumer (``assistant.consumers``), behind Django's full
middleware stack (sessions, authentication, CSRF), answered with a ``StreamingHttpResponse`` over
an async iterator, so each frame is sent the moment it exists (Daphne would read a sync iterator
to the end first). Only the transport differs: same bytes, same records, same timings.
"""

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from assistant import errors, http
from assistant.errors import Rejected
from assistant.services.chat_request import request_id_choose
from assistant.services.frames import frames_with_pings, ping_interval
from assistant.services.stream_start import chat_stream_start
from assistant.services.streaming import chat_stream_body
from assistant.services.timings import StreamTimings, received_at
from assistant.transport import scope_connection

PATH_NAME = "django"


def api_error(
    error: errors.ApiError, headers: list[tuple[bytes, bytes]] | None = None
) -> HttpResponse:
    """An ``ApiError`` as the JSON response both serving paths send."""
    response = HttpResponse(error.body(), status=error.status)
    for name, value in http.json_response_headers(headers):
        response.headers[name.decode("ascii")] = value.decode("latin-1")
    return response


async def chat_stream(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/stream/django``: answer one chat message as Server-Sent Events."""
    # Method, content type and host were checked by the router (assistant.routing), CSRF by
    # the middleware.
    timings = StreamTimings(received=received_at(request.scope))  # type: ignore[attr-defined]
    if int(request.META.get("CONTENT_LENGTH") or 0) > settings.CHATSITE_STREAM["MAX_BODY_BYTES"]:
        return api_error(errors.BODY_TOO_LARGE)
    body = request.body
    if len(body) > settings.CHATSITE_STREAM["MAX_BODY_BYTES"]:
        return api_error(errors.BODY_TOO_LARGE)
    request_id = request_id_choose(request.headers.get("x-request-id"))
    try:
        stream = await chat_stream_start(
            body=body,
            session_key=http.session_key(request),
            request_id=request_id,
            path=PATH_NAME,
            timings=timings,
            connection=scope_connection(request.scope),  # type: ignore[attr-defined]
        )
    except Rejected as rejected:
        return api_error(rejected.error, rejected.headers())
    response = StreamingHttpResponse(
        frames_with_pings(chat_stream_body(stream), ping_interval()), status=200
    )
    for name, value in http.sse_headers(request_id, stream.identity.set_cookie):
        response.headers[name.decode("ascii")] = value.decode("latin-1")
    return response


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponseBase:
    """CSRF failures: JSON for the API (as the direct path answers), Django's page elsewhere."""
    if request.path.startswith("/api/"):
        error = errors.CSRF_FAILED
        return api_error(error.with_message(f"{error.message} ({reason})"))
    from django.views.csrf import csrf_failure as page

    return page(request, reason=reason)
