"""The supervisor's pure decisions and its socket (assistant/modelhost/supervisor.py); its
behaviour with real processes is in tests/assistant/test_model_process.py."""

import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from assistant.modelhost.supervisor import bind, exit_reason, restart_delay


def test_restarts_back_off_while_the_model_process_keeps_dying() -> None:
    """Immediate after a first end, then 0.5 s doubling to at most 30 s."""
    assert [restart_delay(n) for n in range(1, 10)] == [0, 0.5, 1, 2, 4, 8, 16, 30, 30]
    assert exit_reason(-signal.SIGSEGV) == ("SIGSEGV", "SIGSEGV")
    assert exit_reason(-signal.SIGUSR1) == ("SIGUSR1", "signal")
    assert exit_reason(3) == ("exit 3", "load_failed")
    assert exit_reason(1) == ("exit 1", "exit")


def test_the_socket_is_only_bound_where_it_is_safe(tmp_path: Path) -> None:
    """Never over a file that is not a socket, never in a directory others can write to, and
    never over a socket another supervisor serves; the socket itself is 0660."""
    private = Path(tempfile.mkdtemp(prefix="chm-"))
    try:
        (private / "file").write_text("keep me")
        with pytest.raises(SystemExit, match="not a socket"):
            bind(private / "file")
        assert (private / "file").read_text() == "keep me"
        listener = bind(private / "model.sock")
        try:
            assert stat.S_IMODE(os.stat(private / "model.sock").st_mode) == 0o660
            with pytest.raises(SystemExit, match="already serves"):
                bind(private / "model.sock")
        finally:
            listener.close()
        shared = private / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        with pytest.raises(SystemExit, match="only it writes"):
            bind(shared / "model.sock")
    finally:
        shutil.rmtree(private)
