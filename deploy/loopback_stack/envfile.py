"""The environment file, /etc/chatsite/env on a host: made as the guide makes it, read as
systemd reads it.

The guide installs deploy/env.example and asks the operator to change a few lines; the loopback
run changes the same lines (and the ones that differ on loopback, ``ENV_LOOPBACK``) in place, so
the file the units read is the shipped example with exactly those edits. Reading it follows
systemd's EnvironmentFile=, not a shell's rules, because the units are what read it.
"""

import re
from collections.abc import Callable, Mapping
from pathlib import Path

# The lines of /etc/chatsite/env the guide asks to change, and what the loopback stack writes.
ENV_LOOPBACK = {
    # What the guide says until the site has its certificate; loopback stays on plain HTTP.
    "CHATSITE_TLS": "0",
    # Instead of a model (vLLM or llama.cpp): deterministic tokens, nothing to load.
    "CHATSITE_ENGINE": "scripted",
}


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines as systemd's EnvironmentFile= reads them (comments at the start of a
    line, surrounding quotes removed, no expansion)."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not NAME=value: {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[name.strip()] = value
    return env


def set_env_lines(path: Path, values: Mapping[str, str]) -> None:
    """Set NAME=value in an environment file: the active line if there is one, else the
    commented-out example (``# NAME=...``), else a new line at the end."""
    lines = path.read_text().splitlines()
    for name, value in values.items():
        active = [i for i, line in enumerate(lines) if line.startswith(f"{name}=")]
        example = [i for i, line in enumerate(lines) if re.match(rf"#\s*{name}=", line)]
        index = (active or example or [None])[0]
        if index is None:
            lines.append(f"{name}={value}")
        else:
            lines[index] = f"{name}={value}"
    path.write_text("\n".join(lines) + "\n")


def write_env_file(
    path: Path,
    shell: Callable[[str], str],
    values: Mapping[str, str],
    to_loopback: Callable[[str], str],
) -> None:
    """The guide's step: install the example (``shell("env_file")``), set a new secret key
    (``shell("secret")``) and ``values``, then the production paths in it as this stack's."""
    shell("env_file")
    secret = shell("secret").strip()
    set_env_lines(path, {"DJANGO_SECRET_KEY": secret, **values})
    path.write_text(to_loopback(path.read_text()))
