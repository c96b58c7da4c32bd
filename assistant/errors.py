"""Every error a client can cause or see: a stable code, an HTTP status and one clear message."""

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ApiError:
    status: int
    code: str
    message: str

    def payload(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode("utf-8")

    def with_message(self, message: str) -> "ApiError":
        return ApiError(self.status, self.code, message)


class Rejected(Exception):
    """A request refused for a reason the client can fix; ``error`` says which, and its status.
    ``retry_after`` (seconds) becomes a Retry-After header."""

    def __init__(self, error: ApiError, *, retry_after: int | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after is None:
            return []
        return [(b"retry-after", str(self.retry_after).encode("ascii"))]


METHOD_NOT_ALLOWED = ApiError(405, "method_not_allowed", "Use POST to start a chat stream.")
UNSUPPORTED_MEDIA_TYPE = ApiError(
    415, "unsupported_media_type", "Send the request body as JSON (Content-Type: application/json)."
)
BODY_TOO_LARGE = ApiError(413, "body_too_large", "The request body is too large.")
REQUEST_TIMEOUT = ApiError(
    408, "request_timeout", "The request took too long to arrive. Send it again."
)
INVALID_JSON = ApiError(400, "invalid_json", "The request body is not valid JSON.")
INVALID_BODY = ApiError(
    400, "invalid_body", 'Send a JSON object: {"message": "...", "conversation": null}.'
)
MESSAGE_MISSING = ApiError(400, "message_missing", "Type a message first.")
MESSAGE_TOO_LONG = ApiError(400, "message_too_long", "The message is too long.")
MESSAGE_UNREADABLE = ApiError(
    400, "message_unreadable", "The message contains characters that are not text."
)
INVALID_CONVERSATION = ApiError(400, "invalid_conversation", "The conversation id is not valid.")
CONVERSATION_NOT_FOUND = ApiError(404, "conversation_not_found", "No such conversation.")
CSRF_FAILED = ApiError(403, "csrf_failed", "The page's security token is missing or stale.")
BAD_HOST = ApiError(400, "bad_host", "This host name is not served here.")
ENGINE_UNAVAILABLE = ApiError(
    503, "engine_unavailable", "The model is not available right now. Please try again shortly."
)
SERVER_FAILED = ApiError(500, "server_error", "The server failed. Please try again.")
ENGINE_FAILED = ApiError(500, "engine_error", "The model stopped unexpectedly. Please try again.")
BEACON_INVALID = ApiError(400, "beacon_invalid", "The measurement report is not valid.")
BEACON_UNKNOWN = ApiError(404, "beacon_unknown", "No such request.")
BEACON_NOT_YOURS = ApiError(403, "beacon_not_yours", "That request belongs to another session.")
BEACON_DUPLICATE = ApiError(409, "beacon_duplicate", "That request was reported already.")
RATE_LIMITED = ApiError(429, "rate_limited", "Too many requests. Please wait a moment.")
REQUEST_ID_USED = ApiError(
    409,
    "request_id_used",
    "An answer is already running under that request id: send a new one, or none.",
)
STREAM_ACTIVE = ApiError(
    429,
    "stream_active",
    "An answer is still coming in another tab or window. Wait for it, or stop it, first.",
)
SESSION_REQUIRED = ApiError(
    403, "session_required", "Your session has expired. Reload the page to go on."
)
NEW_SESSIONS_LIMITED = ApiError(
    429,
    "new_sessions_limited",
    "Too many new visitors from your network in the last minute. Please try again shortly.",
)
ADDRESS_BUSY = ApiError(
    429,
    "address_busy",
    "Too many answers are streaming to your network at once. Please try again in a few seconds.",
)
#: Why an answer was stopped to let another request onto a full engine (``error`` events).
GIVEN_UP = {
    "fair_share": ApiError(
        503,
        "fair_share",
        "Your network was streaming more answers than its share, so this one was stopped to "
        "let another student in. Ask again in a moment.",
    ),
    "unheard": ApiError(503, "unheard", "This answer was stopped because nobody was reading it."),
}
ENGINE_BUSY = ApiError(
    503, "engine_busy", "Many students are asking right now. Please try again in a few seconds."
)
DATABASE_UNAVAILABLE = ApiError(
    503, "database_unavailable", "The site is having trouble right now. Please try again shortly."
)
STREAM_EXPIRED = ApiError(
    404,
    "stream_expired",
    "That answer can no longer be resumed. What was saved of it is shown instead.",
)
RESUME_INVALID = ApiError(
    400, "resume_invalid", 'Send {"request_id": "..."} and the Last-Event-ID header.'
)
STOP_INVALID = ApiError(400, "stop_invalid", 'Send {"request_id": "..."}.')
STOP_UNKNOWN = ApiError(404, "stop_unknown", "No answer of yours with that id is running here.")
ENGINE_TIMEOUT = ApiError(
    504, "engine_timeout", "The model took too long to answer. Please try again."
)
SPLIT_INVALID = ApiError(400, "split_invalid", "The split setting is not valid.")
WINDOW_INVALID = ApiError(400, "window_invalid", "The window must be one of 5m, 1h or 24h.")
STAFF_ONLY = ApiError(403, "staff_only", "Only staff can see the dashboard.")
LOGIN_REQUIRED = ApiError(401, "login_required", "Log in first.")
