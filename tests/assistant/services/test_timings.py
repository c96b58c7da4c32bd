"""A stream's stage timings in milliseconds (``StreamTimings.as_ms``)."""

from assistant.services.timings import StreamTimings


def test_figures_follow_the_stream_until_it_finishes_then_stay_as_they_were() -> None:
    t = StreamTimings(received=10.0)
    t.parsed, t.engine_submitted, t.engine_first_delta = 10.001, 10.002, 10.098
    t.token_sent(10.1)
    assert t.as_ms()["tokens"] == 1
    assert t.as_ms()["inter_token_mean"] is None
    t.token_sent(10.15)
    t.token_sent(10.25)
    running = t.as_ms()
    assert running["tokens"] == 3
    assert running["finished"] is None
    t.finished = 10.3
    ms = t.as_ms()
    assert ms == {
        "parsed": 1.0,
        "engine_submitted": 2.0,
        "engine_first_token": 98.0,
        "first_token_sent": 100.0,
        "finished": 300.0,
        "queue": 1.0,
        "engine_ttft": 96.0,
        "server_ttft": 100.0,
        "inter_token_mean": 75.0,
        "inter_token_max": 100.0,
        "span": 150.0,
        "tokens": 3,
    }
    # The done frame and the record read the figures of one working-out.
    assert t.as_ms() is ms
