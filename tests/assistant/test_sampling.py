"""A server's CPU sampled with Linux's perf for the benchmarks' ``--profile --profiler perf``
(``assistant/benchmarking/sampling.py``): perf's samples folded into py-spy's raw stacks, from
text as ``perf script`` prints it and from a real recording of a Python process."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assistant.benchmarking.profile import frame_parse, profile_read, raw_write
from assistant.benchmarking.sampling import PERF_ENV, perf_fold, sampler_start, sampler_stop

LIBPYTHON = "/usr/lib/libpython3.12.so.1.0"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
UVLOOP = "/srv/chatsite/.venv/lib/python3.12/site-packages/uvloop/loop.cpython-312.so"
# Four samples as ``perf script -F comm,tid,ip,sym,dso`` prints them: the thread, then the
# frames, innermost first. Process 100's main thread is 100.
SCRIPT = f"""python   100
\t    ffffffff81000 do_syscall_64 ([kernel.kallsyms])
\t           11f0e __send ({LIBC})
\t           4a1c0 UVStream.write ({UVLOOP})
\t           4a0f0 __pyx_pw_UVStream_write ({UVLOOP})
\t          110811 _PyEval_EvalFrameDefault ({LIBPYTHON})
\t    7f90fb2be00c py::Answer.send:/srv/chatsite/assistant/services/answer.py (/tmp/perf-1.map)
\t    7f90fb2be0aa py::Answer.run:/srv/chatsite/assistant/services/answer.py (/tmp/perf-1.map)

python   100
\t           9777e _int_malloc ({LIBC})
\t          1cfe07 _PyObject_Malloc ({LIBPYTHON})
\t          110811 _PyEval_EvalFrameDefault ({LIBPYTHON})
\t    7f90fb2be0f0 py::frame_data:/srv/chatsite/assistant/sse.py (/tmp/perf-1.map)

python   100
\t          110811 _PyEval_EvalFrameDefault ({LIBPYTHON})
\t    7f90fb2be0f0 py::frame_data:/srv/chatsite/assistant/sse.py (/tmp/perf-1.map)

python   101
\t           9777e _int_malloc ({LIBC})
\t           4a1c0 uv__io_poll ({UVLOOP})
"""


def test_a_sample_is_its_innermost_python_function_and_the_library_it_called() -> None:
    assert perf_fold(SCRIPT.splitlines(), pid=100) == {
        # The kernel and the C library under uvloop: uvloop's work, called from Python.
        "[the main thread] ();Answer.send (/srv/chatsite/assistant/services/answer.py);"
        f"[__pyx_pw_UVStream_write] ({UVLOOP})": 1,
        # The interpreter and the C library under no other library: the function's own.
        "[the main thread] ();frame_data (/srv/chatsite/assistant/sse.py)": 2,
        # No Python frame: the outermost C function.
        f"[another thread] ();[uv__io_poll] ({UVLOOP})": 1,
    }
    # Without the process's id, no thread is named.
    assert perf_fold(SCRIPT.splitlines())[f"[uv__io_poll] ({UVLOOP})"] == 1


def test_folded_samples_are_read_as_py_spys(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw_write(perf_fold(SCRIPT.splitlines(), pid=100), raw)
    profile = profile_read(raw)
    assert profile.samples == 4
    assert profile.total[frame_parse("[the main thread] ()")] == 3
    # A checkout in a folder named chatsite: its modules are named from the project's root.
    assert profile.areas["assistant/sse.py"] == 2
    assert profile.areas["assistant/services/answer.py"] == 1
    assert profile.areas["uvloop"] == 1  # a C library's own name


BUSY = """
import json, time
def encode_often():
    end = time.monotonic() + 20
    while time.monotonic() < end:
        json.dumps({"tokens": list(range(200))})
print("ready", flush=True)
encode_often()
"""


def perf_records() -> bool:
    if shutil.which("perf") is None:
        return False
    tried = subprocess.run(
        ["perf", "record", "-o", os.devnull, "--", "true"], capture_output=True, timeout=60
    )
    return tried.returncode == 0


@pytest.mark.skipif(not perf_records(), reason="perf is not installed or may not record here")
def test_perf_samples_a_python_process_by_function(tmp_path: Path) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY], env={**os.environ, **PERF_ENV}, stdout=subprocess.PIPE
    )
    try:
        assert busy.stdout is not None and busy.stdout.readline() == b"ready\n"
        sampler = sampler_start(tmp_path, busy.pid, "busy", "perf")
        assert sampler is not None
        time.sleep(1)
        profile = profile_read(sampler_stop(sampler))
    finally:
        busy.kill()
        busy.wait()
    assert (tmp_path / "busy.data").exists()
    assert profile.samples > 0
    [(top, _)] = profile.own.most_common(1)
    # The busy function's own work, or json's encoder (C) it calls.
    assert top.function in {"encode_often", "JSONEncoder.encode", "[encoder_call]"}, top
    assert sum(n for f, n in profile.own.items() if f.function == "encode_often") > 0
    assert profile.total[frame_parse("[the main thread] ()")] == profile.samples
