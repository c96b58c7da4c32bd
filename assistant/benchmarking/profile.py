"""Where a server's CPU goes, from py-spy's samples: the top of the profile, by function and by
the code it belongs to.

``py-spy record --format raw`` writes one line per distinct stack, its frames from the outermost
to the innermost, then how many samples found the process there:

    <module> (chatsite/server.py:160);run (daphne/server.py:150);... 12

``profile_read`` adds the lines up; ``profile_top`` ranks functions by their own samples
(``self``: the innermost frame) and by the samples they were anywhere on the stack for
(``total``, counted once per stack); ``areas`` sorts every sample by whose code was running:
the innermost frame of chatsite's own code if any frame is chatsite's, else the library of the
innermost frame.
"""

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
#: Where chatsite's own code lives, as py-spy names its files.
OWN = ("assistant/", "chatsite/")
#: chatsite's frames under which everything runs (``python -m chatsite.server``): not its work.
ENTRY = frozenset({"<module>", "main", "ChatsiteServer.run"})
#: Libraries worth naming apart, by the first path part py-spy shows after site-packages.
LIBRARIES = (
    "twisted", "daphne", "django", "channels", "asgiref", "autobahn", "prometheus_client",
    "django_prometheus", "psycopg", "psycopg_pool", "redis", "channels_redis", "whitenoise",
    "asyncio", "json", "sqlite3", "logging", "concurrent", "threading", "selectors", "socket",
    "ssl", "http", "email", "urllib", "uuid", "zoneinfo", "datetime", "uvicorn", "uvloop",
    "httptools", "hiredis", "starlette", "sse_starlette", "anyio", "_json",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    file: str

    @property
    def name(self) -> str:
        return f"{self.function} ({self.file})"

    @property
    def own(self) -> bool:
        if "site-packages" in self.file or not any(part in self.file for part in OWN):
            return False
        return not (self.file.endswith("chatsite/server.py") and self.function in ENTRY)

    @property
    def area(self) -> str:
        """chatsite's module for its own code, else the library, else "other"."""
        path = self.file.replace("\\", "/")
        if self.own:
            start = max(path.rfind(part) for part in OWN)  # under a checkout named chatsite too
            return path[start:]
        tail = path.rsplit("site-packages/", 1)[-1]
        if "/lib/python3" in tail:  # the standard library: after lib/python3.N/
            tail = tail.split("/lib/python3", 1)[1].split("/", 1)[-1]
        first = tail.removeprefix("lib-dynload/").split("/", 1)[0].removesuffix(".py")
        first = first.split(".cpython-", 1)[0]  # a C module: _json.cpython-312-...so
        return first if first in LIBRARIES else "other"


@dataclass(slots=True)
class Profile:
    samples: int = 0
    own: Counter[Frame] = field(default_factory=Counter)
    total: Counter[Frame] = field(default_factory=Counter)
    areas: Counter[str] = field(default_factory=Counter)


def frame_parse(text: str) -> Frame:
    found = _FRAME.match(text.strip())
    if found is None:
        return Frame(text.strip(), "")
    return Frame(found["function"], found["file"])


def raw_write(stacks: Mapping[str, int], path: Path) -> None:
    """Write ``stacks`` (each stack's sample count) at ``path`` as py-spy's raw output."""
    path.write_text("".join(f"{stack} {count}\n" for stack, count in stacks.items()))


def profile_read(path: Path) -> Profile:
    """Add up py-spy's raw output at ``path``."""
    profile = Profile()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_parse(part) for part in stack.split(";")]
        samples = int(count)
        profile.samples += samples
        profile.own[frames[-1]] += samples
        for frame in set(frames):
            profile.total[frame] += samples
        mine = [frame for frame in frames if frame.own]
        # The innermost of chatsite's frames: what chatsite was doing, whoever did the work.
        profile.areas[(mine[-1] if mine else frames[-1]).area] += samples
    return profile


def profile_top(profile: Profile, *, limit: int = 20, own_only: bool = False) -> list[str]:
    """Markdown rows: the functions with the most samples on the stack (``own_only``: chatsite's
    own functions only), with their share of the samples in all and as the innermost frame."""
    ranked = [(count, frame) for frame, count in profile.total.items() if not own_only or frame.own]
    ranked.sort(key=lambda pair: (-pair[0], pair[1].name))
    rows = []
    for count, frame in ranked[:limit]:
        share = 100 * count / max(profile.samples, 1)
        itself = 100 * profile.own[frame] / max(profile.samples, 1)
        rows.append(f"| `{frame.name}` | {share:.1f} % | {itself:.1f} % |")
    return rows


def area_rows(profile: Profile, *, limit: int = 20) -> list[str]:
    """Markdown rows: the share of samples by whose code ran (see the module's docstring)."""
    total = max(profile.samples, 1)
    return [
        f"| `{area}` | {100 * count / total:.1f} % |"
        for area, count in profile.areas.most_common(limit)
    ]
