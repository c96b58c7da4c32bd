"""The wire format between the web workers and the model process (assistant/modelhost/protocol.py):
exact round trips, and what a malformed request is."""

import pytest

from assistant.engines import ChatMessage, Delta, GenerationParams
from assistant.modelhost import protocol
from assistant.modelhost.protocol import End, Failure, HostStatus, Waiting

QUESTION = [ChatMessage("user", "光合作用是什么? What is photosynthesis?")]


def test_requests_and_replies_round_trip_exactly() -> None:
    """Every message survives the wire unchanged, Chinese text and all."""
    params = GenerationParams(max_tokens=7, temperature=0.0, repeat_penalty=1.2)
    request = protocol.request_parse(protocol.generate_request(QUESTION, params))
    assert (request.op, request.messages, request.params) == ("generate", tuple(QUESTION), params)
    assert protocol.request_parse(protocol.STATUS_REQUEST).op == "status"

    for reply in (
        Delta("植物", finish_reason=None),
        Delta("", finish_reason="stop"),
        Delta("", queue_position=3),
        Waiting(2),
        Failure("no_model", "missing", started=True),
        End(),
        HostStatus(state="down", restarts=2, last_exit="SIGSEGV", code="engine_restarting"),
    ):
        if isinstance(reply, Delta):
            line = protocol.delta_line(reply)
        elif isinstance(reply, Waiting):
            line = protocol.waiting_line(reply.others)
        elif isinstance(reply, Failure):
            line = protocol.failure_line(reply)
        elif isinstance(reply, HostStatus):
            line = protocol.hello_line(reply)
        else:
            line = protocol.END
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert protocol.reply_parse(line) == reply


@pytest.mark.parametrize(
    "line",
    [b"{", b"[]", b'{"op": "delete"}', b'{"op": "generate"}',
     b'{"op": "generate", "messages": [{"role": "root", "content": "x"}]}',
     b'{"op": "generate", "messages": [], "params": {"bogus": 1}}'],
)  # fmt: skip
def test_a_malformed_request_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.request_parse(line)
