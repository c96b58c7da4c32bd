"""Every error a client can cause or see: a stable code, an HTTP status and one clear message.

Messages are translated (Simplified Chinese and English) into the language of the request they
answer, when they are sent; codes never change with the language.
"""

import json
import random
from dataclasses import dataclass

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _


@dataclass(frozen=True, slots=True)
class ApiError:
    status: int
    code: str
    #: Lazy: it becomes text in the language active where the error is sent.
    message: str | Promise

    def payload(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": str(self.message)}}

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode("utf-8")

    def with_message(self, message: str | Promise) -> "ApiError":
        return ApiError(self.status, self.code, message)


class Rejected(Exception):
    """A request refused for a reason the client can fix; ``error`` says which, and its status.
    ``retry_after`` (seconds) becomes a Retry-After header."""

    def __init__(self, error: ApiError, *, retry_after: int | None = None) -> None:
        super().__init__(str(error.message))
        self.error = error
        self.retry_after = retry_after

    @classmethod
    def spread(cls, error: ApiError, low: int, high: int) -> "Rejected":
        """Refused with a Retry-After between ``low`` and ``high`` seconds, at random: those
        refused together (a burst) do not all come back together."""
        return cls(error, retry_after=random.randint(low, high))

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after is None:
            return []
        return [(b"retry-after", str(self.retry_after).encode("ascii"))]


METHOD_NOT_ALLOWED = ApiError(405, "method_not_allowed", _("Use POST to start a chat stream."))
UNSUPPORTED_MEDIA_TYPE = ApiError(
    415,
    "unsupported_media_type",
    _("Send the request body as JSON (Content-Type: application/json)."),
)
BODY_TOO_LARGE = ApiError(413, "body_too_large", _("The request body is too large."))
BAD_REQUEST = ApiError(400, "bad_request", _("The request could not be read."))
REQUEST_TIMEOUT = ApiError(
    408, "request_timeout", _("The request took too long to arrive. Send it again.")
)
INVALID_JSON = ApiError(400, "invalid_json", _("The request body is not valid JSON."))
INVALID_BODY = ApiError(
    400, "invalid_body", _('Send a JSON object: {"message": "...", "conversation": null}.')
)
MESSAGE_MISSING = ApiError(400, "message_missing", _("Type a message first."))
MESSAGE_TOO_LONG = ApiError(400, "message_too_long", _("The message is too long."))
MESSAGE_UNREADABLE = ApiError(
    400, "message_unreadable", _("The message contains characters that are not text.")
)
INVALID_CONVERSATION = ApiError(400, "invalid_conversation", _("The conversation id is not valid."))
CONVERSATION_NOT_FOUND = ApiError(404, "conversation_not_found", _("No such conversation."))
INVALID_REPLACES = ApiError(
    400,
    "invalid_replaces",
    _('"replaces" must be the id of one of your questions in this conversation.'),
)
QUESTION_REPLACED = ApiError(
    409,
    "question_replaced",
    _("That question was edited or asked again already. Reload the conversation to go on."),
)
CSRF_FAILED = ApiError(403, "csrf_failed", _("The page's security token is missing or stale."))
BAD_HOST = ApiError(400, "bad_host", _("This host name is not served here."))
ENGINE_UNAVAILABLE = ApiError(
    503, "engine_unavailable", _("The model is not available right now. Please try again shortly.")
)
SERVER_FAILED = ApiError(500, "server_error", _("The server failed. Please try again."))
ENGINE_FAILED = ApiError(
    500, "engine_error", _("The model stopped unexpectedly. Please try again.")
)
BEACON_INVALID = ApiError(400, "beacon_invalid", _("The measurement report is not valid."))
BEACON_UNKNOWN = ApiError(404, "beacon_unknown", _("No such request."))
BEACON_NOT_YOURS = ApiError(403, "beacon_not_yours", _("That request belongs to another session."))
BEACON_DUPLICATE = ApiError(409, "beacon_duplicate", _("That request was reported already."))
RATE_LIMITED = ApiError(429, "rate_limited", _("Too many requests. Please wait a moment."))
REQUEST_ID_USED = ApiError(
    409,
    "request_id_used",
    _("An answer is already running under that request id: send a new one, or none."),
)
STREAM_ACTIVE = ApiError(
    429,
    "stream_active",
    _("An answer is still coming in another tab or window. Wait for it, or stop it, first."),
)
SESSION_REQUIRED = ApiError(
    403, "session_required", _("Your session has expired. Reload the page to go on.")
)
NEW_SESSIONS_LIMITED = ApiError(
    429,
    "new_sessions_limited",
    _("Too many new visitors from your network in the last minute. Please try again shortly."),
)
ADDRESS_BUSY = ApiError(
    429,
    "address_busy",
    _("Too many answers are streaming to your network at once. Please try again in a few seconds."),
)
#: Why an answer was stopped to let another request onto a full engine (``error`` events).
GIVEN_UP = {
    "fair_share": ApiError(
        503,
        "fair_share",
        _(
            "Your network was streaming more answers than its share, so this one was stopped to "
            "let another student in. Ask again in a moment."
        ),
    ),
    "unheard": ApiError(
        503, "unheard", _("This answer was stopped because nobody was reading it.")
    ),
}
ENGINE_BUSY = ApiError(
    503, "engine_busy", _("Many students are asking right now. Please try again in a few seconds.")
)
SITE_BUSY = ApiError(
    503,
    "site_busy",
    _("Many students are opening the site at once. Please try again in a few seconds."),
)
DATABASE_UNAVAILABLE = ApiError(
    503,
    "database_unavailable",
    _("The site is having trouble right now. Please try again shortly."),
)
STREAM_EXPIRED = ApiError(
    404,
    "stream_expired",
    _("That answer can no longer be resumed. What was saved of it is shown instead."),
)
RESUME_INVALID = ApiError(
    400, "resume_invalid", _('Send {"request_id": "..."} and the Last-Event-ID header.')
)
STOP_INVALID = ApiError(400, "stop_invalid", _('Send {"request_id": "..."}.'))
STOP_UNKNOWN = ApiError(404, "stop_unknown", _("No answer of yours with that id is running here."))
ENGINE_TIMEOUT = ApiError(
    504, "engine_timeout", _("The model took too long to answer. Please try again.")
)
SPLIT_INVALID = ApiError(400, "split_invalid", _("The split setting is not valid."))
WINDOW_INVALID = ApiError(400, "window_invalid", _("The window must be one of 5m, 1h or 24h."))
STAFF_ONLY = ApiError(403, "staff_only", _("Only staff can see the dashboard."))
LOGIN_REQUIRED = ApiError(401, "login_required", _("Log in first."))
# Renaming and deleting a conversation (PATCH and DELETE /api/conversations/<id>).
CONVERSATION_METHOD_NOT_ALLOWED = ApiError(
    405, "method_not_allowed", _("Use GET, PATCH or DELETE on a conversation.")
)
TITLE_INVALID = ApiError(400, "title_invalid", _('Send a JSON object: {"title": "..."}.'))
TITLE_MISSING = ApiError(400, "title_missing", _("Type a title first."))
TITLE_TOO_LONG = ApiError(400, "title_too_long", _("The title is too long."))
TITLE_UNREADABLE = ApiError(
    400,
    "title_unreadable",
    _("The title contains control characters or characters that are not text."),
)
CLASS_PAUSED = ApiError(
    403,
    "class_paused",
    _("Your class is paused by its teacher: no questions until it opens again."),
)
JOIN_CODE_UNKNOWN = ApiError(
    404, "join_code_unknown", _("No open class has that code. Check it with your teacher.")
)
JOIN_CODE_EXPIRED = ApiError(
    410, "join_code_expired", _("That class code has expired. Ask your teacher for the new one.")
)
NICKNAME_INVALID = ApiError(
    400, "nickname_invalid", _("A nickname is at most 40 characters, on one line.")
)
TEACHERS_ONLY = ApiError(403, "teachers_only", _("Only teachers can see this."))
CLASS_CHANGED = ApiError(
    409,
    "class_changed",
    _(
        "Your class changed since this page was loaded (you joined or left one, or what your "
        "teacher can see changed). Reload the page to read it before you ask."
    ),
)
# The OpenAI-compatible API (/v1/): sent in OpenAI's error object (``services/openai_wire``).
API_KEY_MISSING = ApiError(
    401,
    "missing_api_key",
    _("Send an API key: Authorization: Bearer csk-... (ask a teacher or an admin for one)."),
)
API_KEY_INVALID = ApiError(401, "invalid_api_key", _("That API key is not valid, or was revoked."))
MODEL_NOT_FOUND = ApiError(404, "model_not_found", _("No such model: GET /v1/models lists them."))
API_METHOD_NOT_ALLOWED = ApiError(405, "method_not_allowed", _("Use POST for chat completions."))
API_MODELS_METHOD = ApiError(405, "method_not_allowed", _("Use GET to list the models."))
API_INVALID_REQUEST = ApiError(400, "invalid_request", _("The request is not valid."))
API_NOT_FOUND = ApiError(
    404, "not_found", _("No such endpoint: see /v1/models and /v1/chat/completions.")
)
# The latency probe (``/api/chat/stream/probe``, ``manage.py ttft_doctor``).
PROBE_METHOD = ApiError(405, "method_not_allowed", _("Use GET for the latency probe."))
PROBE_INVALID = ApiError(
    400,
    "probe_invalid",
    _("The probe takes frames (0-20), interval_ms (0-2000), idle_s (0-120) and accel (0 or 1)."),
)
PROBE_LOGIN = ApiError(
    401,
    "login_required",
    _("Log in as staff, or send an API key: Authorization: Bearer csk-..."),
)
PROBE_FORBIDDEN = ApiError(
    403, "probe_forbidden", _("Only staff or a site API key may use the latency probe.")
)
PROBE_BUSY = ApiError(
    503, "probe_busy", _("Too many latency probes are running here. Try again shortly.")
)
