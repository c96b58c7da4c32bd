"""The top of a py-spy profile (assistant/benchmarking/profile.py), from py-spy's raw stacks."""

from pathlib import Path

from assistant.benchmarking.profile import area_rows, frame_parse, profile_read, profile_top

SITE = "/srv/chatsite/.venv/lib/python3.12/site-packages"
STDLIB = "/usr/lib/python3.12"
ENTRY = "<module> (chatsite/server.py:170);main (chatsite/server.py:166)"
LOOP = f"run_forever ({STDLIB}/asyncio/base_events.py:641)"
RAW = f"""\
{ENTRY};{LOOP};respond (assistant/consumers.py:90);run_db (assistant/db.py:60) 6
{ENTRY};{LOOP};respond (assistant/consumers.py:90);dumps ({STDLIB}/json/__init__.py:231) 3
{ENTRY};{LOOP};write ({SITE}/twisted/internet/abstract.py:350) 10
{ENTRY};{LOOP};select ({STDLIB}/selectors.py:468) 1
not a line
"""


def _profile(tmp_path: Path):
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    return profile_read(raw)


def test_frames_are_read_with_or_without_a_line() -> None:
    frame = frame_parse("Answer.run (assistant/services/answer.py:120)")
    assert (frame.function, frame.file, frame.own) == (
        "Answer.run",
        "assistant/services/answer.py",
        True,
    )
    assert frame_parse("<module> (<string>)").file == "<string>"


def test_samples_are_counted_by_function_and_by_whose_code_ran(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    assert profile.samples == 20
    # chatsite's innermost frame names the work, whoever did it (json under respond); the
    # entry frames of chatsite/server.py are not chatsite's work.
    assert dict(profile.areas) == {
        "assistant/db.py": 6,
        "assistant/consumers.py": 3,
        "twisted": 10,
        "selectors": 1,
    }
    own = profile_top(profile, own_only=True)
    assert own[0] == "| `respond (assistant/consumers.py)` | 45.0 % | 0.0 % |"
    assert own[1] == "| `run_db (assistant/db.py)` | 30.0 % | 30.0 % |"
    assert len(own) == 2
    everything = profile_top(profile, limit=3)
    assert everything[0].startswith("| `<module> (chatsite/server.py)` | 100.0 % |")
    assert area_rows(profile, limit=1) == ["| `twisted` | 50.0 % |"]
