"""stream.js's SSE parser against the WHATWG "event stream interpretation", in headless Chromium.

The vectors are derived from web-platform-tests, eventsource/format-*.any.js and
format-*.window.js (the current layout; the older .htm files carry the same streams). Each WPT
test asks a server script for a stream and checks the events an EventSource dispatches; here the
server's body is written out and fed to the real ``SSEParser``:

- ``resources/message.py`` answers ``message`` + ("\\n\\n" unless ``newline=none``) + "\\n";
- ``resources/last-event-id.py`` answers "id: " + ``idvalue`` (default U+2026) +
  "\\nretry: 200\\ndata: hello\\n\\n" when no Last-Event-ID header came;
- ``resources/last-event-id2.py`` answers fixed streams by ``type``.

Several WPT tests also check what EventSource does over the network (reconnecting after the
stream ends, sending Last-Event-ID, waiting ``retry`` ms). The parser has no network, so only
the parsing expectation of the first response is kept; each such vector says so. The
format-mime-* tests check the HTTP layer (Content-Type) and do not apply.
"""

import uuid
from typing import Any

import pytest
from playwright.sync_api import Page

from assistant import ids
from assistant.services.chat_request import request_id_valid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STREAM_JS = "/static/chatsite/stream.js"
LONG = "x" * 2048  # format-comments' longstring: (new Array(2*1024+1)).join("x")


def message_py(message: str, newline: bool = True) -> str:
    """The body of WPT's resources/message.py for ``message`` (``newline=none`` → False)."""
    return message + ("\n\n" if newline else "") + "\n"


def last_event_id_py(idvalue: str = "\u2026") -> str:
    """The first body of WPT's resources/last-event-id.py (no Last-Event-ID header sent)."""
    return "id: " + idvalue + "\nretry: 200\ndata: hello\n\n"


def vector(
    source: str, stream: str, events: list[tuple[str, str, str]], retry: int | None = None
) -> dict[str, Any]:
    """A stream and what it dispatches: [event type, data, lastEventId] for each event, and the
    reconnection time the stream leaves set (None: never set)."""
    return {
        "source": source,
        "stream": stream,
        "events": [list(event) for event in events],
        "retry": retry,
    }


VECTORS = [
    # The decoder drops the BOM that opens the stream; a later one is part of the field name
    # "\ufeffdata", unknown, so that block has no data and is not dispatched.
    vector(
        "format-bom.any.js",
        message_py("\ufeffdata:1\n\n\ufeffdata:2\n\ndata:3"),
        [("message", "1", ""), ("message", "3", "")],
    ),
    # Only one BOM is dropped: the second spoils the first block's field name.
    vector(
        "format-bom-2.any.js",
        message_py("\ufeff\ufeffdata:1\n\ndata:2\n\ndata:3"),
        [("message", "2", ""), ("message", "3", "")],
    ),
    # Comments (a NUL, empty, 2 KiB long, one that looks like a field) under every line end.
    vector(
        "format-comments.any.js",
        message_py(
            "data:1\r:\0\n:\r\ndata:2\n:" + LONG + "\rdata:3\n:data:fail\r:" + LONG + "\ndata:4\n",
            newline=False,
        ),
        [("message", "1\n2\n3\n4", "")],
    ),
    # The stream ends inside the second block: it is discarded, and its id never becomes the
    # lastEventId. (WPT sees "test1" again, with lastEventId "", from the reconnection that
    # retry:1000 paces: network behaviour, not checked here.)
    vector(
        "format-data-before-final-empty-line.any.js",
        message_py("retry:1000\ndata:test1\n\nid:test\ndata:test2", newline=False),
        [("message", "test1", "")],
        retry=1000,
    ),
    # "data:" adds an empty line, a bare "data" too: "" then "\n".
    vector(
        "format-field-data.any.js",
        message_py("data:\n\ndata\ndata\n\ndata:test"),
        [("message", "", ""), ("message", "\n", ""), ("message", "test", "")],
    ),
    # The event type applies to its own block only.
    vector(
        "format-field-event.any.js",
        message_py("event:test\ndata:x\n\ndata:x"),
        [("test", "x", ""), ("message", "x", "")],
    ),
    # An empty event type dispatches as "message".
    vector(
        "format-field-event-empty.any.js",
        message_py("event: \ndata:data"),
        [("message", "data", "")],
    ),
    # A non-ASCII id. (WPT then checks that the reconnection sends it as Last-Event-ID and that
    # it is still lastEventId there: network behaviour, not checked here.)
    vector(
        "format-field-id.any.js",
        last_event_id_py(),
        [("message", "hello", "\u2026")],
        retry=200,
    ),
    # The same server answer as format-field-id; WPT reconnects twice instead of once.
    vector(
        "format-field-id-2.any.js",
        last_event_id_py(),
        [("message", "hello", "\u2026")],
        retry=200,
    ),
    # last-event-id2.py?type=1: the last event ID persists across events until set again.
    vector(
        "format-field-id-3.window.js (persists)",
        "id: 1\ndata: 1\n\ndata: 2\n\nid: 2\ndata:3\n\ndata:4\n\n",
        [
            ("message", "1", "1"),
            ("message", "2", "1"),
            ("message", "3", "2"),
            ("message", "4", "2"),
        ],
    ),
    # type=2: "id:" with no value sets it back to "".
    vector(
        "format-field-id-3.window.js (resets)",
        "id: 1\ndata: 1\n\nid:\ndata:2\n\ndata:3\n\n",
        [("message", "1", "1"), ("message", "2", ""), ("message", "3", "")],
    ),
    # type=3: so does a bare "id" line.
    vector(
        "format-field-id-3.window.js (resets, id without colon)",
        "id: 1\ndata: 1\n\nid\ndata:2\n\ndata:3\n\n",
        [("message", "1", "1"), ("message", "2", ""), ("message", "3", "")],
    ),
    # An id containing U+0000 anywhere is ignored. (WPT also checks that no Last-Event-ID is
    # sent on reconnection: network behaviour, not checked here.)
    *(
        vector(
            f"format-field-id-null.window.js (idvalue={idvalue!r})",
            last_event_id_py(idvalue),
            [("message", "hello", "")],
            retry=200,
        )
        for idvalue in ["\0\0", "x\0", "\0x", "x\0x", "\0"]
    ),
    # Field names are case-sensitive and exact; one space after the colon is removed, not two;
    # CR, LF and CRLF all end lines.
    vector(
        "format-field-parsing.any.js",
        message_py(
            "data:\0\ndata:  2\rData:1\ndata\0:2\ndata:1\r\0data:4\nda-ta:3\rdata_5\ndata:3\r"
            "data:\r\n data:32\ndata:4\n",
            newline=False,
        ),
        [("message", "\0\n 2\n1\n3\n\n4", "")],
    ),
    # retry is base ten even with a leading zero: 3000 ms, not octal. (WPT measures the
    # reconnection delay; here the parsed value is checked.)
    vector(
        "format-field-retry.any.js",
        message_py("retry:03000\ndata:x"),
        [("message", "x", "")],
        retry=3000,
    ),
    # A retry value that is not all digits is ignored: 3000 stays.
    vector(
        "format-field-retry-bogus.any.js",
        message_py("retry:3000\nretry:1000x\ndata:x"),
        [("message", "x", "")],
        retry=3000,
    ),
    # A bare "retry" (empty value) is ignored and does not disturb the event.
    vector(
        "format-field-retry-empty.any.js",
        message_py("retry\ndata:test"),
        [("message", "test", "")],
    ),
    # Unknown fields, a field name with a leading space, bare text and comments are skipped.
    vector(
        "format-field-unknown.any.js",
        message_py(
            "data:test\n data\ndata\nfoobar:xxx\njustsometext\n:thisisacommentyay\ndata:test"
        ),
        [("message", "test\n\ntest", "")],
    ),
    # Only a space is removed after the colon, not a tab; "data: " adds an empty line.
    vector(
        "format-leading-space.any.js",
        message_py("data:\ttest\rdata: \ndata:test"),
        [("message", "\ttest\n\ntest", "")],
    ),
    # CRLF, LF, CRLF, then a CRLF blank line.
    vector(
        "format-newlines.any.js",
        message_py("data:test\r\ndata\ndata:test\r\n\r", newline=False),
        [("message", "test\n\ntest", "")],
    ),
    # U+0000 in data is kept.
    vector(
        "format-null-character.any.js",
        message_py("data:\0\n\n"),
        [("message", "\0", "")],
    ),
    # The stream is UTF-8 whatever charset the Content-Type names; the parser gets decoded
    # text, so here it must pass U+2026 through (the decoding is checked with streamChat below).
    vector(
        "format-utf-8.any.js",
        message_py("data:ok\u2026"),
        [("message", "ok\u2026", "")],
    ),
]

# Feeds each vector's stream to a new SSEParser per way of chunking it, in the page.
RUN_VECTORS = """async ([url, vectors, chunked]) => {
  const { SSEParser } = await import(url);
  const parse = (chunks) => {
    const events = [];
    const parser = new SSEParser((e) => events.push([e.event, e.data, e.id]));
    for (const chunk of chunks) parser.push(chunk);
    return { events, retry: parser.retry ?? null };
  };
  return vectors.map(({ stream }) => {
    const whole = parse([stream]);
    if (!chunked) return { whole, differ: [] };
    const ways = { "one character at a time": Array.from(stream) };
    for (let i = 0; i <= stream.length; i++) {
      ways[`split at ${i}`] = [stream.slice(0, i), stream.slice(i)];
    }
    const differ = [];
    for (const [how, chunks] of Object.entries(ways)) {
      const got = parse(chunks);
      if (JSON.stringify(got) !== JSON.stringify(whole)) differ.push({ how, ...got });
    }
    return { whole, differ };
  });
}"""


def run_vectors(page: Page, chunked: bool) -> list[dict[str, Any]]:
    return page.evaluate(RUN_VECTORS, [STREAM_JS, VECTORS, chunked])


def test_wpt_vectors_dispatch_the_expected_events(page: Page) -> None:
    """Each WPT-derived stream, fed whole, dispatches exactly the expected events (type, data,
    last event ID) and leaves the expected reconnection time."""
    results = run_vectors(page, chunked=False)
    for case, result in zip(VECTORS, results, strict=True):
        got = result["whole"]
        assert got["events"] == case["events"], case["source"]
        assert got["retry"] == case["retry"], case["source"]


def test_wpt_vectors_parse_the_same_however_the_stream_is_chunked(page: Page) -> None:
    """Fed one character at a time, or in two chunks split at any position (a CRLF split
    between its CR and LF included), every stream gives what it gives fed whole, and that is
    the expected result."""
    results = run_vectors(page, chunked=True)
    for case, result in zip(VECTORS, results, strict=True):
        assert result["whole"]["events"] == case["events"], case["source"]
        differ = result["differ"]
        assert not differ, f"{case['source']}: {len(differ)} chunkings differ, first {differ[0]}"


def test_a_line_ended_by_cr_is_processed_at_once(page: Page) -> None:
    """A CR ends its line at once: push("data: x\\r\\r") dispatches before any further push.
    A LF opening the next chunk is the second half of that CRLF and is skipped, even after an
    empty push in between; a LF later on is a line end of its own."""
    got = page.evaluate(
        """async (url) => {
          const { SSEParser } = await import(url);
          const run = (chunks) => {
            const seen = [];
            const parser = new SSEParser((e) => seen.push(e.data));
            return chunks.map((chunk) => { parser.push(chunk); return [...seen]; });
          };
          return {
            crOnly: run(["data: x\\r\\r"]),
            crThenLf: run(["data: x\\r", "", "\\ndata: y\\n\\n"]),
            lfLater: run(["data: x\\r", "a", "\\n\\n"]),
          };
        }""",
        STREAM_JS,
    )
    assert got["crOnly"] == [["x"]]
    assert got["crThenLf"] == [[], [], ["x\ny"]]
    # "data: x" ended at the CR; "a" (a field without a value) ends at the LF; the blank line
    # dispatches.
    assert got["lfLater"] == [[], [], ["x"]]


def test_the_last_event_id_persists_until_set_again(page: Page) -> None:
    """The last event ID is not reset by a dispatch: "id: 7" then two events gives both id
    "7". An id containing U+0000 is ignored; "id" with no value sets it to ""."""
    got = page.evaluate(
        """async (url) => {
          const { SSEParser } = await import(url);
          const run = (text) => {
            const ids = [];
            new SSEParser((e) => ids.push(e.id)).push(text);
            return ids;
          };
          return [
            run("id: 7\\ndata: a\\n\\ndata: b\\n\\n"),
            run("id: 7\\ndata: a\\n\\nid: 8\\u0000\\ndata: b\\n\\nid\\ndata: c\\n\\n"),
            run("data: a\\n\\n"),
          ];
        }""",
        STREAM_JS,
    )
    assert got == [["7", "7"], ["7", "7", ""], [""]]


def test_retry_is_exposed_and_reported(page: Page) -> None:
    """A retry field of ASCII digits sets ``parser.retry`` and calls ``onRetry``; any other
    value changes nothing."""
    got = page.evaluate(
        """async (url) => {
          const { SSEParser } = await import(url);
          const reported = [];
          const parser = new SSEParser(() => {}, (ms) => reported.push(ms));
          const before = parser.retry;
          parser.push("retry: 1500\\nretry: 15x\\nretry: -1\\nretry: 1.5\\nretry:\\nretry: 0\\n");
          return { before, after: parser.retry, reported };
        }""",
        STREAM_JS,
    )
    assert got == {"before": None, "after": 0, "reported": [1500, 0]}


# The stream that the mocked fetch below delivers one byte at a time: two BOMs (only one may
# be dropped), a CR-only block with a multi-byte character, a repeated token id (dropped by
# streamChat) and the final "done".
PIPELINE_STREAM = (
    '\ufeff\ufeffevent: token\nid: 1\ndata: "spoilt"\n\n'
    'event: token\rid: 2\rdata: "ok\u2026"\r\r'
    'event: token\r\nid: 2\r\ndata: "again"\r\n\r\n'
    'event: done\ndata: {"text": "fine"}\n\n'
)

RUN_STREAM_CHAT = """async ([url, text]) => {
  const { streamChat } = await import(url);
  const bytes = new TextEncoder().encode(text);
  const realFetch = window.fetch;
  window.fetch = async () => new Response(
    new ReadableStream({
      start(controller) {
        for (const byte of bytes) controller.enqueue(new Uint8Array([byte]));
        controller.close();
      },
    }),
    { headers: { "Content-Type": "text/event-stream; charset=windows-1252" } },
  );
  try {
    const events = [];
    const { finished } = streamChat({
      url: "/nowhere", body: {}, csrfToken: "x",
      onEvent: (type, data, id) => events.push([type, data, id]),
    });
    return { events, result: await finished };
  } finally {
    window.fetch = realFetch;
  }
}"""


def test_stream_chat_decodes_and_parses_byte_by_byte(page: Page) -> None:
    """Through streamChat, bytes arriving one at a time: the body is decoded as UTF-8 whatever
    charset is named, exactly one BOM is dropped (the second spoils the first field name, so
    that block is a plain "message"), CR-only lines work, and a token whose id was already
    seen is dropped."""
    got = page.evaluate(RUN_STREAM_CHAT, [STREAM_JS, PIPELINE_STREAM])
    assert got["events"] == [
        ["message", "spoilt", "1"],
        ["token", "ok\u2026", "2"],
        ["done", {"text": "fine"}, "2"],
    ]
    assert got["result"] == {"outcome": "done", "text": "fine"}


def test_retry_after_is_read_from_an_error_answer(page: Page) -> None:
    """An error answer's Retry-After becomes ``retryAfter`` in seconds: delay-seconds as
    given, an HTTP-date as the seconds from now (0 once past), anything else or nothing null."""
    got = page.evaluate(
        """async (url) => {
          const { streamChat, retryAfterSeconds } = await import(url);
          const realFetch = window.fetch;
          const answer = async (headers) => {
            window.fetch = async () => new Response(
              JSON.stringify({ error: { code: "busy", message: "Busy." } }),
              { status: 429, headers: { "Content-Type": "application/json", ...headers } },
            );
            try {
              const { finished } = streamChat({ url: "/nowhere", body: {}, csrfToken: "x" });
              return await finished;
            } finally {
              window.fetch = realFetch;
            }
          };
          const inAMinute = new Date(Date.now() + 60000).toUTCString();
          const bogus = [];
          for (const value of ["soon", "-5", "1.5", "", "12 s", "a 5"]) {
            bogus.push((await answer({ "Retry-After": value })).retryAfter);
          }
          // The three HTTP-date forms, half a second before 07:28:00 GMT.
          const now = Date.UTC(2015, 9, 21, 7, 27, 59, 500);
          const forms = [
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "Wednesday, 21-Oct-15 07:28:00 GMT",
            "Wed Oct 21 07:28:00 2015",
          ].map((value) => retryAfterSeconds(value, now));
          return {
            forms,
            seconds: await answer({ "Retry-After": "120" }),
            date: (await answer({ "Retry-After": inAMinute })).retryAfter,
            past: (await answer({ "Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT" })).retryAfter,
            none: (await answer({})).retryAfter,
            bogus,
          };
        }""",
        STREAM_JS,
    )
    assert got["seconds"]["outcome"] == "error"
    assert got["seconds"]["code"] == "busy"
    assert got["seconds"]["retryAfter"] == 120
    # toUTCString() drops the milliseconds, so 59 or 60 seconds remain.
    assert 58 <= got["date"] <= 60
    assert got["past"] == 0
    assert got["none"] is None
    assert got["bogus"] == [None] * 6
    assert got["forms"] == [1, 1, 1]  # rounded up: the countdown never ends early


def test_the_pages_request_ids_are_version_7_uuids_the_server_takes(page: Page) -> None:
    """``newRequestId``: 32 hex digits of a version 7 UUID, as the server makes its own (the
    millisecond it was made in, then 74 random bits), which the server reuses as they come."""
    got = page.evaluate(
        """async (url) => {
          const { newRequestId } = await import(url);
          const before = Date.now();
          const now = newRequestId();
          const after = Date.now();
          const at = [1700000000000, 1700000000001, 1700000000255, 1700000000256];
          const many = Array.from({ length: 200 }, () => newRequestId(at[0]));
          return { before, now, after, at, sorted: at.map((t) => newRequestId(t)), many };
        }""",
        STREAM_JS,
    )
    made = [got["now"], *got["sorted"], *got["many"]]
    assert all(request_id_valid(value) and len(value) == 32 for value in made)
    parsed = [uuid.UUID(hex=value) for value in made]
    assert {u.version for u in parsed} == {7}
    assert {u.variant for u in parsed} == {uuid.RFC_4122}
    assert got["before"] <= parsed[0].int >> 80 <= got["after"]
    assert [uuid.UUID(hex=value).int >> 80 for value in got["sorted"]] == got["at"]
    assert sorted(got["sorted"]) == got["sorted"]
    assert len(set(got["many"])) == 200
    varying = 0
    for value in got["many"]:
        varying |= uuid.UUID(hex=value).int & ((1 << 80) - 1)
    assert varying == ids._KEEP | ids._MARK  # every random bit varies; the marks are fixed
