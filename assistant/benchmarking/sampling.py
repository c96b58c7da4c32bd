"""Sampling a server's CPU while a benchmark loads it, for ``--profile DIR``: with py-spy or with
Linux's perf (``--profiler``).

- **py-spy** (the default) samples the thread holding the GIL 1,000 times a second and sees the
  whole Python stack. It reads the process from outside, so it counts a thread that holds the
  GIL while it waits in a system call (a socket write) as busy.
- **perf** (``perf record --call-graph dwarf``) samples every thread of the process, and only
  while it runs on a CPU, so a system call counts for the CPU it takes and nothing more. The
  server must run with ``PYTHONPERFSUPPORT=1`` (Python 3.12), which puts each Python function's
  name in a trampoline perf can read. perf cannot unwind the stack past the first trampoline
  (Python is built without frame pointers), so a sample names the innermost Python function,
  and the C function it called where the sample was in C code of another library or in the
  kernel (``[send] (.../uvloop/loop.so)``), not the Python frames above it.

Both write py-spy's raw format (``frame;frame;... count``, outermost first), which
``profile.profile_read`` adds up. perf's recording is kept beside it (``label.data``).
"""

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from assistant.benchmarking.profile import area_rows, profile_read, profile_top, raw_write

PROFILERS = ("py-spy", "perf")
#: The environment a server needs for perf to name its Python functions.
PERF_ENV = {"PYTHONPERFSUPPORT": "1"}
#: perf's samples a second. Each carries a copy of the stack (8 kB), which ``perf script``
#: unwinds afterwards: a few hundred a second keep that to a minute for a level.
PERF_RATE = 300
#: The interpreter's own code, the C library and the kernel (by the start of the library's file
#: name): a sample there, under a Python function and no other library, is the function's own.
_NOT_CALLED = ("libpython3", "python3", "libc.so", "ld-linux", "[kernel", "[vdso]")


@dataclass(slots=True)
class Sampler:
    profiler: str
    process: subprocess.Popen[bytes]
    #: The sampled process's.
    pid: int
    #: py-spy's raw stacks, written by py-spy or folded from perf's recording.
    out: Path
    label: str


def sampler_start(folder: Path | None, pid: int, label: str, profiler: str) -> Sampler | None:
    """Start sampling process ``pid`` into ``folder``/``label``.txt, if profiling."""
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{label}.txt"
    if profiler == "perf":
        command = ["perf", "record", "-F", str(PERF_RATE), "--call-graph", "dwarf"]
        command += ["-p", str(pid), "-o", str(out.with_suffix(".data"))]
    else:
        # --gil: the thread holding the GIL, so threads and an event loop waiting are not.
        command = ["py-spy", "record", "--pid", str(pid), "--rate", "1000", "--nonblocking"]
        command += ["--gil", "--format", "raw", "-o", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1)  # attached before the first request
    return Sampler(profiler, process, pid, out, label)


def sampler_stop(sampler: Sampler) -> Path:
    """Stop sampling; the raw stacks' file."""
    sampler.process.send_signal(signal.SIGINT)
    _, errors = sampler.process.communicate(timeout=60)
    if sampler.profiler == "perf":
        data = sampler.out.with_suffix(".data")
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "--no-inline", "-F", "comm,tid,ip,sym,dso"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if script.returncode:
            raise RuntimeError(f"perf script failed: {script.stderr}")
        folded = perf_fold(script.stdout.splitlines(), sampler.pid)
        raw_write(folded, sampler.out)
    if not sampler.out.exists() or not sampler.out.stat().st_size:
        said = errors.decode(errors="replace")
        raise RuntimeError(f"{sampler.profiler} wrote no profile: {said}")
    return sampler.out


def sampler_show(sampler: Sampler | None) -> None:
    """Stop sampling and print the top of the profile."""
    if sampler is None:
        return
    profile = profile_read(sampler_stop(sampler))
    what = (
        f"on the CPU, every thread ({PERF_RATE} a second)"
        if sampler.profiler == "perf"
        else "of the server's Python work (1,000 a second)"
    )
    print(f"\n{sampler.label}: {profile.samples} samples {what}")
    print("\n| whose code ran | share |\n| --- | --- |")
    print("\n".join(area_rows(profile, limit=15)))
    print("\n| chatsite's function | on the stack | innermost |\n| --- | --- | --- |")
    print("\n".join(profile_top(profile, limit=25, own_only=True)))
    print("\n| any function | on the stack | innermost |\n| --- | --- | --- |")
    print("\n".join(profile_top(profile, limit=25)) + "\n", flush=True)


def perf_fold(lines: Iterable[str], pid: int | None = None) -> Counter[str]:
    """py-spy's raw stacks from ``perf script -F comm,tid,ip,sym,dso``'s lines: for each sample
    its thread (``comm tid``), then its frames, one a line (``address symbol (library)``,
    innermost first), a blank line after it.

    A sample becomes its innermost Python function (``function (file)``), then, when the sample
    was in a C library it called (an extension module: uvloop, hiredis, psycopg's), the first
    function of that library's under it (``[function] (library)``). Samples in the interpreter,
    the C library or the kernel under no such library are the Python function's own. A sample
    unwound to no Python function is its outermost C function alone. Given the process's
    ``pid``, each stack starts with its thread: ``[the main thread]`` (the event loop's) or
    ``[another thread]``."""
    folded: Counter[str] = Counter()
    thread: str | None = None
    frames: list[tuple[str, str]] = []
    for line in [*lines, ""]:
        if line[:1].isspace() and line.strip():
            _, _, rest = line.strip().partition(" ")
            symbol, _, library = rest.rpartition(" (")
            frames.append((symbol, library.removesuffix(")")))
        elif line.strip():  # a sample's thread
            tid = line.split()[-1]
            main = pid is not None and tid == str(pid)
            thread = (
                None if pid is None else "[the main thread] ()" if main else "[another thread] ()"
            )
        elif frames:
            stack = _stack(frames)
            folded[f"{thread};{stack}" if thread else stack] += 1
            frames, thread = [], None
    return folded


def _stack(frames: list[tuple[str, str]]) -> str:
    """One sample's frames (innermost first) as py-spy's stack (outermost first)."""
    python = next((i for i, (symbol, _) in enumerate(frames) if symbol.startswith("py::")), None)
    if python is None:  # unwound no further than C code
        symbol, library = frames[-1]
        return f"[{symbol}] ({library})"
    function, _, file = frames[python][0].removeprefix("py::").partition(":")
    for symbol, library in reversed(frames[:python]):  # from the Python function inwards
        if not library.rpartition("/")[2].startswith(_NOT_CALLED):
            return f"{function} ({file});[{symbol}] ({library})"
    return f"{function} ({file})"
