"""Where a host keeps chatsite's files, and where the loopback run keeps them instead.

docs/deploy.md names production places (/srv/chatsite, /etc/chatsite, /run); the loopback run
performs the same steps with this checkout and a folder of its own. Every path a step writes or
reads goes through ``Layout``, so that one substitution per place is all that differs from a
host, as the table at the end of the guide says.
"""

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NGINX_DIR = ROOT / "deploy" / "nginx"
SYSTEMD_DIR = ROOT / "deploy" / "systemd"
STATIC_DIR = ROOT / "frontend" / "static"
# settings.STATIC_ROOT as the loopback env file leaves it: CHATSITE_STATIC_ROOT unset, its default.
STATIC_ROOT = ROOT / "staticfiles"
DEFAULT_DIR = Path(tempfile.gettempdir()) / "chatsite-loopback"
# systemd's PATH for services, and the one a clean shell falls back to.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


@dataclass(frozen=True)
class Layout:
    """The folder ``work`` of one loopback stack, and the production places inside it."""

    work: Path

    @property
    def state_file(self) -> Path:
        return self.work / "state.json"

    @property
    def env_file(self) -> Path:
        return self.work / "etc" / "chatsite" / "env"

    @property
    def logs(self) -> Path:
        return self.work / "log"

    @property
    def nginx(self) -> Path:
        return self.work / "nginx"

    @property
    def staff_password(self) -> Path:
        return self.work / "staff"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def to_loopback(self, text: str) -> str:
        """A production path in ``text`` as this stack's (the checkout is this one)."""
        places = {
            "/srv/chatsite": str(ROOT),
            "/etc/chatsite": str(self.work / "etc" / "chatsite"),
            "/run": str(self.work / "run"),
        }
        pattern = r"(?<![^\s=\"'])(" + "|".join(map(re.escape, places)) + r")(?=[/\s\"']|$)"
        return re.sub(pattern, lambda m: places[m.group(1)], text)
