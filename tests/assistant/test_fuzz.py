"""Fuzzing the JSON endpoints over real HTTP against Daphne.

Whatever arrives (any JSON value, any bytes, odd headers), the answer comes within a few seconds
and is either a 4xx with a JSON error and no traceback, or a well-formed event stream that ends
with ``done`` or ``error``; never a 5xx, and the server keeps serving. The examples are
derandomized so every run sends the same requests.
"""

import json
import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import (
    HealthCheck,
    Phase,
    currently_in_test_context,
    event,
    example,
    given,
    settings,
)
from hypothesis import strategies as st

from assistant.benchmarking import SSEEvent, SSEParser
from assistant.engines.scripted import default_tokens
from assistant.models import Message, StreamRecord
from tests.support import ChatClient, LiveServer, RawResponse, raw_post, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

STREAM_URLS = ("/api/chat/stream/direct", "/api/chat/stream/django")
BEACON_URL = "/api/chat/beacon"
RESUME_URL = "/api/chat/resume"
#: An answer, error or whole stream, takes longer than this only if something hangs.
ANSWER_WITHIN_S = 5.0
#: What the scripted engine says to any message without a directive, on the server below.
TOKENS = 3
ANSWER = "".join(default_tokens(TOKENS))
MAX_MESSAGE_CHARS = 4000
MAX_BODY_BYTES = 32 * 1024

# No shrinking: every example is a real request (and a hang costs seconds), so a failure
# reports the first example found, which derandomize makes the same on every run.
FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture(scope="module")
def server(daphne_factory) -> LiveServer:
    """Daphne whose scripted engine answers at once (three tokens, no delays), so that a few
    hundred requests take seconds, with rate limits out of the way of the fuzzer and answers
    kept for resuming."""
    return daphne_factory(
        CHATSITE_SCRIPTED_TTFT_MS="0",
        CHATSITE_SCRIPTED_ITL_MS="0",
        CHATSITE_SCRIPTED_TOKENS=str(TOKENS),
        CHATSITE_BEACON_RATE="100000",
        CHATSITE_CHAT_RATE="100000",
        # Finished answers stay resumable, so resume requests can find one.
        CHATSITE_RESUME_GRACE_S="30",
    )


@dataclass(frozen=True)
class Visitor:
    """A browser that has loaded the page: its cookies and CSRF token."""

    cookies: dict[str, str]

    @property
    def token(self) -> str:
        return self.cookies["csrftoken"]


def visit(server: LiveServer) -> Visitor:
    """A new visitor, with a session of its own, so no per-session limit (one stream at a
    time, requests per minute) carries over from one example to the next."""
    response = raw_post(server.port, b"", method="GET", path="/")
    try:
        assert response.status == 200
        cookies = [value.split(";")[0] for name, value in response.headers if name == "set-cookie"]
    finally:
        response.sock.close()
    return Visitor(dict(cookie.split("=", 1) for cookie in cookies))


# --- what a well-behaved answer looks like ------------------------------------------------------


def strict_events(body: bytes) -> list[SSEEvent]:
    """The events of a complete event-stream body (``SSEParser``), once each frame is checked
    line by line as the encoder writes it: UTF-8, LF line ends only, every frame closed by a
    blank line, only ``id``, ``event`` and ``data`` fields, each at most once and exactly one
    ``data`` line per event, comments ignored."""
    text = body.decode("utf-8")  # strict: a frame that is not UTF-8 fails here
    assert "\r" not in text, f"a bare CR would end a line early: {text!r}"
    assert text.endswith("\n\n"), f"the last frame is not closed: {text[-200:]!r}"
    frames = 0
    for raw in text[:-2].split("\n\n"):
        lines = raw.split("\n")
        if all(line.startswith(":") for line in lines):
            continue
        names: Counter[str] = Counter()
        for line in lines:
            name, sep, _ = line.partition(": ")
            assert sep and name in {"id", "event", "data"}, f"stray line {line!r} in {raw!r}"
            names[name] += 1
        assert names["data"] == 1, f"not one data line: {raw!r}"
        assert max(names.values()) == 1, raw
        frames += 1
    events = SSEParser().feed(body)
    assert len(events) == frames, (len(events), frames)
    return events


@dataclass(frozen=True)
class Answer:
    """One well-formed stream: its meta, its tokens in order, and the event that ended it."""

    meta: dict[str, Any]
    tokens: list[str]
    end: str
    end_data: dict[str, Any]


def stream_answer(body: bytes, *, after: int = 0) -> Answer:
    """Check a stream's events: ``meta`` first, tokens numbered from ``after`` + 1 (a resumed
    stream starts after the last token its page had) whose data is one line of JSON
    ``{"text": str}``, exactly one ``done`` or ``error``, last."""
    frames = strict_events(body)
    assert frames and frames[0].event == "meta", frames[:1]
    meta = json.loads(frames[0].data)
    assert isinstance(meta, dict) and meta.get("request_id"), meta
    ends = [i for i, f in enumerate(frames) if f.event in {"done", "error"}]
    assert ends == [len(frames) - 1], f"not one done/error, last: {frames}"
    tokens = []
    for frame in frames[1:-1]:
        payload = json.loads(frame.data)
        if frame.event != "token":
            continue
        assert frame.id == str(after + len(tokens) + 1), frame
        assert list(payload) == ["text"] and isinstance(payload["text"], str), payload
        tokens.append(payload["text"])
    end = frames[-1]
    end_data = json.loads(end.data)
    if end.event == "done":
        # Resumed past the last token, a stream has no token to count from.
        assert end_data["tokens"] == after + len(tokens) or (after and not tokens), end_data
    else:
        assert isinstance(end_data["code"], str) and isinstance(end_data["message"], str)
    return Answer(meta, tokens, end.event, end_data)


def check_error(response: RawResponse, body: bytes) -> dict[str, str]:
    """A 4xx: JSON ``{"error": {"code", "message"}}``, no traceback."""
    assert 400 <= response.status < 500, (response.status, body[:500])
    text = body.decode("utf-8", errors="replace")
    assert "Traceback" not in text and 'File "' not in text, text[:500]
    assert response.header("content-type") == "application/json", (response.headers, text[:300])
    payload = json.loads(body)
    error = payload["error"]
    assert set(error) == {"code", "message"}, payload
    # An expired resume also carries what was saved of the answer.
    assert set(payload) == {"error"} or error["code"] == "stream_expired", payload
    assert isinstance(error["code"], str) and error["code"], payload
    assert isinstance(error["message"], str) and error["message"], payload
    return error


@dataclass
class Outcome:
    response: RawResponse
    body: bytes
    answer: Answer | None = None
    error: dict[str, str] | None = None

    def label(self) -> str:
        """What happened, for Hypothesis' statistics (``--hypothesis-show-statistics``)."""
        if self.answer is not None:
            return f"200 stream, {self.answer.end}"
        code = self.error["code"] if self.error else "-"
        return f"{self.response.status} {code}"


def send(
    server: LiveServer,
    visitor: Visitor,
    body: bytes,
    *,
    path: str,
    headers: dict[str, str] | None = None,
    after: int = 0,
) -> Outcome:
    """POST ``body`` on a new connection and check what comes back, whatever it is: in time,
    never a 5xx, a JSON error or a well-formed stream."""
    started = time.monotonic()
    all_headers = {"Content-Type": "application/json", "X-CSRFToken": visitor.token}
    all_headers.update(headers or {})
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}"]
    lines.append("Cookie: " + "; ".join(f"{k}={v}" for k, v in visitor.cookies.items()))
    lines += [f"{k}: {v}" for k, v in all_headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    try:
        with socket.create_connection(("127.0.0.1", server.port), ANSWER_WITHIN_S) as sock:
            sock.sendall(request)
            response = RawResponse(sock)
            answer_body = response.body()
    except TimeoutError:
        pytest.fail(f"no complete answer within {ANSWER_WITHIN_S} s")
    elapsed = time.monotonic() - started
    assert elapsed < ANSWER_WITHIN_S, f"answered after {elapsed:.1f} s"
    assert response.status < 500, (response.status, answer_body[:500])
    outcome = Outcome(response, answer_body)
    if response.status == 200:
        assert response.header("content-type") == "text/event-stream; charset=utf-8"
        outcome.answer = stream_answer(answer_body, after=after)
    elif response.status == 204:
        assert answer_body == b""
    else:
        outcome.error = check_error(response, answer_body)
    if currently_in_test_context():
        event(outcome.label())
    return outcome


# --- strategies ---------------------------------------------------------------------------------


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` three times in four, else ``odd``: enough well-formed input to get past the
    first check and reach the later ones."""
    return st.integers(0, 3).flatmap(lambda k: odd if k == 3 else usual)


#: Any text JSON can carry, lone surrogates included (``json.dumps`` writes them as \\ud800).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**400, -(10**4000), 2**63, -(2**63) - 1]),
    # NaN and the infinities are written as the literals NaN, Infinity, -Infinity.
    st.floats(),
    ANY_TEXT,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)
# Around the limits: 4000 characters is the longest message, 32 KiB the largest body; an
# astral character is one character but 12 bytes once JSON escapes it.
LIMIT_MESSAGES = st.builds(
    lambda char, count: char * count,
    st.sampled_from(["x", "é", "\U0001f600", " ", "\x00", "\u2028"]),
    st.sampled_from(
        [MAX_MESSAGE_CHARS - 1, MAX_MESSAGE_CHARS, MAX_MESSAGE_CHARS + 1, MAX_BODY_BYTES]
    ),
)
MESSAGES = st.one_of(
    # A leading "[scripted ...]" would be a directive to the engine: kept out of plain questions.
    ANY_TEXT.filter(lambda text: not text.startswith("[scripted")),
    st.sampled_from(["", " ", "\n\t \r", "\x00", "\ud800", "\udfff\ud800", "a\x00b", "\ufeff"]),
    LIMIT_MESSAGES,
    JSON_VALUES,
)
CONVERSATIONS = st.one_of(
    st.none(),
    st.uuids().map(str),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: f"urn:uuid:{u}"),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    JSON_VALUES,
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> Any:
    """A chat request: ``message`` and ``conversation`` of any type, or missing, among extra
    keys; or any JSON value at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON_VALUES)
    body = draw(st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=3))
    if draw(st.integers(0, 5)):
        body["message"] = draw(MESSAGES)
    if draw(st.booleans()):
        body["conversation"] = draw(CONVERSATIONS)
    return body


def json_bytes(value: Any, *, ascii_only: bool, spaced: bool) -> bytes:
    """``value`` as JSON; without ``ascii_only`` a lone surrogate becomes invalid UTF-8."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    return text.encode("utf-8", errors="surrogatepass")


JSON_BODIES = st.builds(json_bytes, chat_bodies(), ascii_only=st.booleans(), spaced=st.booleans())


def nested(opener: bytes, closer: bytes, depth: int, closed: bool) -> bytes:
    return opener * depth + (closer * depth if closed else b"")


RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    # Deep nesting, closed or not, within the body size limit.
    st.builds(
        nested,
        st.sampled_from([b"[", b'{"a":', b'{"message":[']),
        st.just(b""),
        st.integers(1, 6000),
        st.just(False),
    ),
    st.builds(nested, st.just(b"["), st.just(b"]"), st.integers(1, 16000), st.booleans()),
    st.sampled_from(
        [
            b"",
            b"NaN",
            b"-Infinity",
            b'{"message": NaN}',
            b'{"message": "hi", "conversation": Infinity}',
            b'{"message": "hi", "n": ' + b"9" * 5000 + b"}",
            b"1" * 5000,
            b'{"message": "\\ud800"}',
            b'{"message": "\\udc00\\ud800 reversed pair"}',
            b'{"message": "\xff\xfe invalid UTF-8"}',
            b'{"message": "\xed\xa0\x80 an encoded surrogate"}',
            b'{"message": "nul \x00 raw"}',
            b'{"message": "hi"}\x00',
            b'{"message": "hi"} trailing',
            b'{"message": "hi", "message": 1}',
            b'{"message": "x"' + b" " * MAX_BODY_BYTES + b"}",
            b"\xef\xbb\xbf" + b'{"message": "hi after a BOM"}',
            '{"message": "hi in UTF-16"}'.encode("utf-16"),
            '{"message": "hi in UTF-32"}'.encode("utf-32"),
        ]
    ),
    # A valid request cut short or with a byte flipped.
    st.builds(
        lambda body, cut: body[:cut],
        JSON_BODIES,
        st.integers(0, 60),
    ),
    st.builds(
        lambda body, at, byte: body[:at] + bytes([byte]) + body[at + 1 :],
        JSON_BODIES,
        st.integers(0, 40),
        st.integers(0, 255),
    ),
)

#: Header values Daphne passes on (it refuses NUL, CR, LF and a few other bytes itself).
HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f\x85"),
    max_size=80,
)
JSON_CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-16",
        "APPLICATION/JSON",
        " application/json ",
        "application/json; boundary=x; q=0.5",
    ]
)
OTHER_CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            "application/json, text/plain",
            "application/jsonx",
            "application/problem+json",
            "text/json",
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=fuzz",
            "",
        ]
    ),
    HEADER_TEXT,
)
CONTENT_TYPES = st.one_of(JSON_CONTENT_TYPES, OTHER_CONTENT_TYPES)
VALID_REQUEST_IDS = st.from_regex(r"[A-Za-z0-9._-]{8,64}", fullmatch=True)
REQUEST_IDS = st.one_of(
    VALID_REQUEST_IDS,
    HEADER_TEXT,
    st.sampled_from(["", "short", "a" * 65, "spaces in id", "id/with/slashes", "ïd-latin-1-é"]),
)


def is_json_type(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"


# --- the properties -----------------------------------------------------------------------------


@FUZZ
@given(path=st.sampled_from(STREAM_URLS), body=JSON_BODIES)
@example(path=STREAM_URLS[0], body=b'{"message": "\\ud800"}')
@example(path=STREAM_URLS[1], body=b'{"message": "a\\u0000b", "extra": {"x": [1e999]}}')
def test_any_json_body_gets_an_error_or_a_whole_stream(
    server: LiveServer, path: str, body: bytes
) -> None:
    """Any JSON value: a JSON 4xx, or the scripted answer in a well-formed stream."""
    outcome = send(server, visit(server), body, path=path)
    if outcome.answer is not None:
        assert outcome.answer.end == "done", outcome.answer
        assert "".join(outcome.answer.tokens) == ANSWER
        assert outcome.answer.meta["path"] == path.rsplit("/", 1)[1]


@FUZZ
@given(path=st.sampled_from(STREAM_URLS), body=RAW_BODIES)
def test_any_bytes_get_an_error_or_a_whole_stream(
    server: LiveServer, path: str, body: bytes
) -> None:
    """Any bytes, deep nesting, huge numbers and invalid UTF-8 included: a JSON 4xx or a stream."""
    outcome = send(server, visit(server), body, path=path)
    if outcome.answer is not None:
        assert outcome.answer.end == "done", outcome.answer


@pytest.mark.parametrize("path", [*STREAM_URLS, BEACON_URL, RESUME_URL])
@pytest.mark.parametrize(
    "body", [b"[" * 2000 + b"]" * 2000, b"[" * 4000], ids=["closed", "unclosed"]
)
def test_deeply_nested_json_gets_a_400(server: LiveServer, path: str, body: bytes) -> None:
    """JSON nested deeper than the parser recurses (within every body size limit) is refused
    as invalid JSON (a resume calls every malformed request ``resume_invalid``), not a crash."""
    outcome = send(server, visit(server), body, path=path)
    assert outcome.response.status == 400
    expected = "resume_invalid" if path == RESUME_URL else "invalid_json"
    assert outcome.error is not None and outcome.error["code"] == expected


@FUZZ
@given(
    path=st.sampled_from(STREAM_URLS),
    content_type=mostly(JSON_CONTENT_TYPES, OTHER_CONTENT_TYPES),
    request_id=st.one_of(st.none(), REQUEST_IDS),
    csrf=mostly(st.none(), HEADER_TEXT),
)
def test_odd_headers_get_an_error_or_a_whole_stream(
    server: LiveServer, path: str, content_type: str, request_id: str | None, csrf: str | None
) -> None:
    """Content types, request ids and CSRF tokens of any shape: 415 for anything but JSON,
    403 for a wrong token, a stream otherwise; a well-formed X-Request-Id is reused."""
    visitor = visit(server)
    headers = {"Content-Type": content_type}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    if csrf is not None:
        headers["X-CSRFToken"] = csrf
    body = b'{"message": "Why is the sky blue?"}'
    outcome = send(server, visitor, body, path=path, headers=headers)
    if not is_json_type(content_type):
        assert outcome.error is not None and outcome.error["code"] == "unsupported_media_type"
        return
    if csrf is not None and csrf.strip() != visitor.token:
        assert outcome.error is not None and outcome.error["code"] == "csrf_failed"
        return
    assert outcome.answer is not None, outcome.error
    sent = (request_id or "").strip(" \t")
    chosen = outcome.response.header("x-request-id")
    assert outcome.answer.meta["request_id"] == chosen
    if re.fullmatch(r"[A-Za-z0-9._-]{8,64}", sent):
        assert chosen == sent
    else:
        assert chosen is not None and re.fullmatch(r"[0-9a-f]{32}", chosen), chosen


def directive(tokens: list[str], *, itl_ms: int = 0) -> str:
    """A question that makes the scripted engine send exactly ``tokens``: JSON inside single
    quotes, so a quote in a token is written as its JSON escape."""
    text = json.dumps(tokens).replace("'", "\\u0027")
    return f"[scripted ttft_ms=0 itl_ms={itl_ms} text='{text}'] Say exactly this."


#: Model output of any shape: markup, control characters, SSE syntax, line breaks of all kinds.
TOKEN_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            '\n\ndata: {"text":"INJECTED"}\n\n',
            "\r",
            "\r\n",
            "event: done\n",
            ": comment",
            "\nid: 99\n",
            "retry: 1\n\n",
            "\x00",
            "\u2028\u2029\x85",
            "</script>",
            "\\",
            '"',
            "'",
            "]",
        ]
    ),
)


@FUZZ
@given(path=st.sampled_from(STREAM_URLS), tokens=st.lists(TOKEN_TEXT, min_size=1, max_size=8))
def test_any_model_text_arrives_token_for_token(
    server: LiveServer, path: str, tokens: list[str]
) -> None:
    """Whatever the model says, each token event decodes to exactly the token it sent (empty
    ones are skipped), and the stream ends with ``done``."""
    outcome = send(
        server, visit(server), json.dumps({"message": directive(tokens)}).encode(), path=path
    )
    assert outcome.answer is not None, outcome.error
    assert outcome.answer.tokens == [t for t in tokens if t]
    assert outcome.answer.end == "done"


@pytest.fixture
def reporter(server: LiveServer) -> tuple[Visitor, str]:
    """A visitor with one finished stream of its own, stored, to report on."""
    visitor = visit(server)
    outcome = send(server, visitor, b'{"message": "Measure me."}', path=STREAM_URLS[0])
    assert outcome.answer is not None
    request_id = outcome.answer.meta["request_id"]
    wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).exists())
    return visitor, request_id


BEACON_NUMBERS = st.one_of(
    st.none(),
    st.floats(),
    st.floats(0, 15 * 60 * 1000),
    st.integers(),
    st.booleans(),
    ANY_TEXT,
    st.lists(st.integers(), max_size=2),
    st.sampled_from([0, -0.0, 900_000, 900_001, 1e308, 10**400]),
)
BEACON_COUNTS = st.one_of(st.none(), st.integers(-2, 200_000), st.floats(), st.booleans(), ANY_TEXT)


@pytest.fixture
def accepted() -> list[dict[str, Any]]:
    """The reports a test's examples got a 204 for."""
    return []


NUMBER_FIELDS = (
    "ttfb_ms",
    "ttft_ms",
    "done_ms",
    "waited_ms",
    "itl_mean_ms",
    "itl_max_ms",
    "span_ms",
)
#: What a report's fields can be changed to: any JSON, and values near each field's limits.
BEACON_FIELDS = {
    "request_id": st.one_of(st.text(max_size=7), st.text(min_size=65), JSON_VALUES),
    "outcome": st.one_of(
        st.sampled_from(["ok", "error", "stopped", "timeout", "abandoned", "OK", ""]), JSON_VALUES
    ),
    **dict.fromkeys(NUMBER_FIELDS, BEACON_NUMBERS),
    "tokens": BEACON_COUNTS,
    "burst_gaps": BEACON_COUNTS,
    "csrf_token": st.one_of(ANY_TEXT, JSON_VALUES),
    "": JSON_VALUES,
    "extra": JSON_VALUES,
}
#: Up to three fields of a valid report changed; none changed is the valid report itself.
BEACON_CHANGES = st.lists(st.sampled_from(sorted(BEACON_FIELDS)), max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: BEACON_FIELDS[name] for name in names})
)


@FUZZ
@given(
    changes=BEACON_CHANGES,
    content_type=mostly(
        st.sampled_from(["text/plain;charset=UTF-8", "application/json"]), CONTENT_TYPES
    ),
    ascii_only=st.booleans(),
)
def test_any_beacon_gets_a_clean_answer(
    server: LiveServer,
    reporter: tuple[Visitor, str],
    accepted: list[dict[str, Any]],
    changes: dict[str, Any],
    content_type: str,
    ascii_only: bool,
) -> None:
    """Any report (the CSRF token in the body, as sendBeacon sends it): 204 the first time a
    valid one arrives, otherwise a JSON 4xx."""
    visitor, request_id = reporter
    report = {
        "request_id": request_id,
        "outcome": "ok",
        "ttft_ms": 50.0,
        "tokens": 3,
        "csrf_token": visitor.token,
        **changes,
    }
    encoded = json_bytes(report, ascii_only=ascii_only, spaced=False)
    headers = {"Content-Type": content_type, "X-CSRFToken": ""}
    outcome = send(server, visitor, encoded, path=BEACON_URL, headers=headers)
    assert outcome.answer is None
    if outcome.response.status == 204:
        assert not accepted, "the same request was reported twice"
        accepted.append(report)


@FUZZ
@given(body=RAW_BODIES)
def test_any_bytes_to_the_beacon_get_a_clean_answer(
    server: LiveServer, reporter: tuple[Visitor, str], body: bytes
) -> None:
    """Any bytes as a report, the way sendBeacon sends it: a JSON 4xx (no CSRF token in it)."""
    visitor, _ = reporter
    outcome = send(server, visitor, body, path=BEACON_URL, headers={"Content-Type": "text/plain"})
    assert outcome.error is not None


#: Last-Event-ID values: token ids, and anything else a header can hold.
LAST_EVENT_IDS = st.one_of(
    st.none(),
    st.integers(-2, 5).map(str),
    HEADER_TEXT,
    st.sampled_from(["", "1e3", "0x10", " 2 ", "9" * 5000, "-0", "+1", "\u00bd"]),
)
#: Stands for the id of the reporter's own (finished, still resumable) stream.
OWN_REQUEST = "<own request>"
RESUME_BODIES = mostly(
    st.builds(
        json_bytes,
        st.fixed_dictionaries(
            {"request_id": mostly(st.just(OWN_REQUEST), st.one_of(ANY_TEXT, JSON_VALUES))},
            optional={"extra": JSON_VALUES},
        ),
        ascii_only=st.booleans(),
        spaced=st.just(False),
    ),
    RAW_BODIES,
)


@FUZZ
@given(body=RESUME_BODIES, last_event_id=LAST_EVENT_IDS)
def test_any_resume_gets_an_error_or_the_rest_of_the_answer(
    server: LiveServer, reporter: tuple[Visitor, str], body: bytes, last_event_id: str | None
) -> None:
    """Any resume request: a JSON 4xx, or the reporter's finished answer from the token after
    Last-Event-ID, ending with ``done``."""
    visitor, request_id = reporter
    body = body.replace(OWN_REQUEST.encode(), request_id.encode())
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    try:
        after = int(last_event_id or 0)
    except ValueError:
        after = -1
    outcome = send(server, visitor, body, path=RESUME_URL, headers=headers, after=max(after, 0))
    if outcome.answer is not None:
        assert after >= 0
        assert outcome.answer.tokens == default_tokens(TOKENS)[after:]
        assert outcome.answer.end == "done"


# --- what the fuzzer found, pinned down ---------------------------------------------------------


def eventually(predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Whether ``predicate`` holds within ``timeout`` (rows are stored after the stream ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.mark.parametrize(
    "change",
    [
        {"outcome": ["ok"]},
        {"outcome": {"ok": True}},
        {"ttft_ms": 10**400},
        {"waited_ms": -(10**400), "ttft_ms": None},
    ],
    ids=["outcome-list", "outcome-object", "huge-integer", "huge-negative-integer"],
)
def test_a_malformed_beacon_gets_a_400_not_a_500(
    server: LiveServer, reporter: tuple[Visitor, str], change: dict[str, Any]
) -> None:
    """A report whose outcome is not a string, or whose timing is an integer too large for a
    float, is refused like any other invalid report."""
    visitor, request_id = reporter
    report = {"request_id": request_id, "outcome": "ok", "ttft_ms": 5.0, **change}
    body = json.dumps({**report, "csrf_token": visitor.token}).encode()
    result = send(server, visitor, body, path=BEACON_URL, headers={"Content-Type": "text/plain"})
    assert result.response.status == 400
    assert result.error is not None and result.error["code"] == "beacon_invalid"


@pytest.mark.parametrize("path", [BEACON_URL, RESUME_URL])
@pytest.mark.parametrize(
    "request_id",
    ["abcdefgh\x00", "abcdefgh" + chr(0xD800)],
    ids=["nul", "lone-surrogate"],
)
def test_a_request_id_no_request_can_have_is_refused(
    server: LiveServer, reporter: tuple[Visitor, str], path: str, request_id: str
) -> None:
    """Request ids are 8-64 of ``A-Za-z0-9._-``. A report or a resume for an id with a lone
    surrogate (no UTF-8 database takes it) or NUL (PostgreSQL refuses it) gets a 4xx at once:
    not a database error, and not a debug page that cannot be encoded and never arrives."""
    visitor, _ = reporter
    report = {"request_id": request_id, "outcome": "ok", "ttft_ms": 5.0, "tokens": 1}
    body = json.dumps({**report, "csrf_token": visitor.token}).encode()
    result = send(server, visitor, body, path=path, headers={"Content-Type": "text/plain"})
    assert result.error is not None


def stored_in_full(meta: dict[str, Any]) -> bool:
    """The question, the answer and the stream's record of ``meta`` are all in the database."""
    messages = Message.objects.filter(id__in=[meta["user_message"], meta["message"]])
    return (
        messages.count() == 2
        and StreamRecord.objects.filter(request_id=meta["request_id"]).exists()
    )


@pytest.mark.parametrize("path", STREAM_URLS)
@pytest.mark.parametrize(
    "message",
    ["\ud800 half of a surrogate pair", "\udc00\ud800 a reversed pair", "before\x00after"],
    ids=["lone-surrogate", "reversed-pair", "nul"],
)
def test_a_question_no_database_can_store_is_refused_or_kept(
    server: LiveServer, path: str, message: str
) -> None:
    """JSON text can carry lone surrogates (no UTF-8 database stores them) and NUL (PostgreSQL
    refuses it in text): such a question gets a 400, or is stored with its answer and record
    like any other. It is never answered and then lost."""
    body = json.dumps({"message": message}).encode()
    outcome = send(server, visit(server), body, path=path)
    if outcome.error is not None:
        assert outcome.response.status == 400
        return
    assert outcome.answer is not None and outcome.answer.end == "done"
    assert eventually(lambda: stored_in_full(outcome.answer.meta)), (
        "the question was answered, then lost"
    )


@pytest.mark.parametrize("path", STREAM_URLS)
def test_a_reused_request_id_does_not_lose_the_answer(server: LiveServer, path: str) -> None:
    """A client that sends the same X-Request-Id twice (a fixed id, a replayed request) still
    has both answers saved: the id's uniqueness among stream records is not the answer's
    problem."""
    visitor = visit(server)
    request_id = f"fixed-id-{uuid.uuid4().hex[:12]}"
    metas = []
    for question in ("first question", "second question"):
        outcome = send(
            server,
            visitor,
            json.dumps({"message": question}).encode(),
            path=path,
            headers={"X-Request-Id": request_id},
        )
        assert outcome.answer is not None and outcome.answer.end == "done"
        metas.append(outcome.answer.meta)
        # The first stream's record is stored before the second stream starts.
        wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).exists())
    answers = [meta["message"] for meta in metas]
    assert eventually(lambda: Message.objects.filter(id__in=answers).count() == 2), (
        "an answer was streamed but never saved"
    )


def test_the_server_still_answers_after_the_fuzzing(server: LiveServer) -> None:
    """Last: after everything above, a plain question gets its whole answer on both paths."""
    assert server.process.poll() is None
    client = ChatClient(server)
    try:
        for path in STREAM_URLS:
            events = client.ask("What is photosynthesis?", url=path)
            assert [e.event for e in events] == ["meta", *["token"] * TOKENS, "done"]
            assert "".join(e.json()["text"] for e in events[1:-1]) == ANSWER
    finally:
        client.close()
