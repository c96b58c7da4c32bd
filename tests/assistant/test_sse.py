"""The SSE encoder, checked against exact bytes."""

import json

import pytest

from assistant import sse


def test_event_with_id_and_name_is_exact() -> None:
    """Fields come in id, event, data order and the frame ends with a blank line."""
    assert sse.encode_event('{"text":"Hi"}', event="token", id="1") == (
        b'id: 1\nevent: token\ndata: {"text":"Hi"}\n\n'
    )


def test_plain_data_event() -> None:
    assert sse.encode_event("hello") == b"data: hello\n\n"


def test_empty_data_still_makes_an_event() -> None:
    """An empty data line dispatches an event with empty data, per the spec."""
    assert sse.encode_event("") == b"data: \n\n"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("a\nb", b"data: a\ndata: b\n\n"),
        ("a\r\nb", b"data: a\ndata: b\n\n"),
        ("a\rb", b"data: a\ndata: b\n\n"),
        ("a\n\nb", b"data: a\ndata: \ndata: b\n\n"),
        ("end\n", b"data: end\ndata: \n\n"),
    ],
)
def test_multiline_data_is_split_into_data_lines(data: str, expected: bytes) -> None:
    """CR, LF and CRLF each end a data line; a parser joins them back with LF."""
    assert sse.encode_event(data) == expected


def test_data_cannot_inject_a_new_event() -> None:
    """Model text that looks like SSE stays inside data lines."""
    frame = sse.encode_event("x\n\nevent: done\ndata: pwned")
    assert frame == b"data: x\ndata: \ndata: event: done\ndata: data: pwned\n\n"
    assert frame.count(b"\n\n") == 1


def test_json_event_is_one_compact_line_in_utf8() -> None:
    frame = sse.encode_json_event({"text": "über\n<b>"}, event="token", id="7")
    assert frame == 'id: 7\nevent: token\ndata: {"text":"über\\n<b>"}\n\n'.encode()


def test_json_event_cannot_inject_a_new_event() -> None:
    """The JSON path writes its data as one line without splitting it: JSON escapes CR and LF,
    so model text with every kind of line break stays inside that one data line."""
    text = "x\r\n\r\nevent: done\rdata: pwned\n\nid: 9\u2028\u0085"
    frame = sse.encode_json_event({"text": text}, event="token", id="3")
    assert frame.count(b"\n") == 4  # id, event, data, and the blank line
    assert b"\r" not in frame
    data = frame.decode().split("\n")[2]
    assert json.loads(data.removeprefix("data: ")) == {"text": text}


@pytest.mark.parametrize(
    "payload",
    [
        {"finish_reason": "stop", "tokens": 2, "timings": {"parsed": 0.25, "span": None}},
        {"光合作用": ["é", 1, 2.5, True, False, None, {"x": []}], "u": 'a\u2028b\x00"\\'},
        [float("nan"), float("inf"), -0.0, 10**20],
        "a plain string",
        7,
        None,
    ],
)
def test_json_event_data_is_compact_json_dumps(payload: object) -> None:
    """The data is what ``json.dumps`` writes with compact separators and UTF-8 text."""
    dumped = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    assert sse.encode_json_event(payload, event="e") == f"event: e\ndata: {dumped}\n\n".encode()


def test_json_event_refuses_what_json_cannot_write() -> None:
    with pytest.raises(TypeError):
        sse.encode_json_event({"a": {1, 2}})


@pytest.mark.parametrize("field", ["event", "id"])
def test_json_event_refuses_line_breaks_in_event_or_id(field: str) -> None:
    with pytest.raises(ValueError):
        sse.encode_json_event({}, **{field: "a\rb"})


def test_retry_field() -> None:
    assert sse.encode_event("x", retry_ms=1500) == b"retry: 1500\ndata: x\n\n"


@pytest.mark.parametrize("field", ["event", "id"])
def test_line_breaks_in_event_or_id_are_refused(field: str) -> None:
    with pytest.raises(ValueError):
        sse.encode_event("x", **{field: "a\nb"})


def test_nul_in_id_is_refused() -> None:
    """Browsers ignore an id containing NUL, which would silently break resumption."""
    with pytest.raises(ValueError):
        sse.encode_event("x", id="a\0b")


def test_comments() -> None:
    assert sse.encode_comment("open") == b": open\n\n"
    assert sse.encode_comment("ping") == b": ping\n\n"
    assert sse.encode_comment() == b":\n\n"
    assert sse.encode_comment("a\nb") == b": a\n: b\n\n"


@pytest.mark.parametrize(
    "text",
    ["Hello", " world", "", 'a "quote" \\ slash', "line\nbreak\r\n", "光合作用", "\x00\x1f", "😀"],
)
@pytest.mark.parametrize("token_id", [1, 42, 100000])
def test_token_event_is_the_json_event_byte_for_byte(text: str, token_id: int) -> None:
    expected = sse.encode_json_event({"text": text}, event="token", id=str(token_id))
    assert sse.encode_token_event(text, token_id) == expected
