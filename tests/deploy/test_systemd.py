"""deploy/systemd and deploy/env.example, checked with the real systemd-analyze.

The units are rendered mechanically into a temporary directory: the example install's
executables (under /srv/chatsite and /srv/vllm, and curl) are replaced with programs that exist
here, and nothing else changes unless a test says which line it breaks on purpose. Neither
`systemd-analyze verify` nor `systemd-analyze security --offline` needs a running service
manager or root, so this runs in a container as any user (systemd 250 or later: Debian 12 has
252).
"""

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support import ROOT, settings_run

SYSTEMD_DIR = ROOT / "deploy" / "systemd"
ENV_EXAMPLE = ROOT / "deploy" / "env.example"
VLLM_DOC = ROOT / "docs" / "vllm.md"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# The modules that read chatsite's environment: settings, and the ASGI entry point.
ENV_READERS = (
    ROOT / "chatsite" / "settings.py",
    ROOT / "chatsite" / "asgi.py",
    # The event loop is chosen before Django's settings are read.
    ROOT / "chatsite" / "event_loop.py",
)

WORKER = "chatsite@.service"
UVICORN_WORKER = "chatsite-uvicorn@.service"
MIGRATE = "chatsite-migrate.service"
METRICS_DIR = "chatsite-metrics-dir.service"
TARGET = "chatsite.target"
VLLM = "vllm.service"
MODEL = "chatsite-model.service"
PRUNE = "chatsite-prune.service"
PRUNE_TIMER = "chatsite-prune.timer"
SUMS = "chatsite-traffic-sum.service"
SUMS_TIMER = "chatsite-traffic-sum.timer"
# What verify loads: every shipped unit, each worker template as two instances.
VERIFIED = (
    TARGET, "chatsite@8001.service", "chatsite@8002.service", "chatsite-uvicorn@8011.service",
    "chatsite-uvicorn@8012.service", MIGRATE, METRICS_DIR, MODEL, VLLM, PRUNE, PRUNE_TIMER, SUMS,
    SUMS_TIMER,
)  # fmt: skip
CHATSITE_UNITS = (
    "chatsite@8001.service", "chatsite-uvicorn@8011.service", MIGRATE, METRICS_DIR, MODEL, PRUNE,
    SUMS,
)  # fmt: skip

# The example install's executables, and what a rendering runs instead (each must occur).
EXAMPLE_EXECUTABLES = {
    "/srv/chatsite/.venv/bin/python": str(ROOT / ".venv" / "bin" / "python"),
    # vLLM needs a GPU and is not installed here.
    "/srv/vllm/.venv/bin/vllm": shutil.which("true") or "/bin/true",
    # A dependency of the GPU host, not of the tests.
    "/usr/bin/curl": shutil.which("curl") or shutil.which("true") or "/bin/true",
}

# Highest exposure `systemd-analyze security` may rate a unit (0 safest, 10 unsafe).
CHATSITE_MAX_EXPOSURE = 2.0
VLLM_MAX_EXPOSURE = 4.0

# The sandbox every chatsite unit runs in, whatever the overall score says.
SANDBOX = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
}

# The flags that matter for TTFT and operation; each must be passed and documented.
VLLM_REQUIRED_FLAGS = (
    "--host",
    "--port",
    "--enable-prefix-caching",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--tensor-parallel-size",
)
VLLM_FORBIDDEN_FLAGS = {
    "--disable-log-stats": "it also leaves /metrics without vllm:* figures",
    "--disable-log-requests": "deprecated since vLLM 0.10.2 and off by default",
}

# Variables chatsite reads that deploy/env.example leaves out on purpose.
NOT_FOR_PRODUCTION = {
    r"CHATSITE_(CANDIDATE_)?SCRIPTED_\w+": "the scripted engine is the tests' stand-in for a model",
    r"CHATSITE_SQLITE_PATH": "the local profile's database file; production uses DATABASE_URL",
    r"CHATSITE_(CANDIDATE_)?MODEL_SOCKET": "the units set it beside the directory it names; the "
    "environment file would override them",
}
# Assignments in env.example that hold secrets: shipped empty or with an obvious placeholder.
SECRETS = ("DJANGO_SECRET_KEY", "DATABASE_URL", "CHATSITE_VLLM_API_KEY")
PLACEHOLDER = "CHANGE-ME"

# (file under deploy/systemd, text, replacement): a deliberate change to a shipped unit.
Edit = tuple[str, str, str]
Unit = dict[str, list[tuple[str, str]]]


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin"])
    path = shutil.which("systemd-analyze", path=search)
    if path is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package).")
    return path


def render(work: Path, edits: Sequence[Edit] = (), drop: Sequence[str] = ()) -> Path:
    """Copy the shipped units into ``work`` with this machine's executables in the examples'."""
    shipped = {p.name: p.read_text() for p in sorted(SYSTEMD_DIR.iterdir()) if is_unit(p.name)}
    combined = "".join(shipped.values())
    for example in EXAMPLE_EXECUTABLES:
        assert example in combined, f"{example} no longer occurs in deploy/systemd/"
    for name, old, new in edits:
        assert old in shipped[name], f"{old!r} is not in {name}"
        shipped[name] = shipped[name].replace(old, new)
    work.mkdir(parents=True, exist_ok=True)
    for name, text in shipped.items():
        if name in drop:
            continue
        for example, here in EXAMPLE_EXECUTABLES.items():
            text = text.replace(example, here)
        (work / name).write_text(text)
    return work


def is_unit(name: str) -> bool:
    return name.endswith((".service", ".target", ".timer"))


def analyze(
    systemd_analyze: str, work: Path, *args: str, timeout: int = 60
) -> subprocess.CompletedProcess[str]:
    """Run systemd-analyze in ``work`` with plain, deterministic output."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        # Notices and worse: what verify prints for a unit it had to correct or could not load.
        # A caller's SYSTEMD_LOG_LEVEL=debug would otherwise fill the output with noise.
        "SYSTEMD_LOG_LEVEL": "notice",
        "SYSTEMD_LOG_COLOR": "0",
        "SYSTEMD_COLORS": "0",
        "SYSTEMD_PAGER": "",
    }
    return subprocess.run(
        [systemd_analyze, *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def verify(systemd_analyze: str, work: Path, units: Sequence[str] = VERIFIED):
    # --man=no: Documentation= is not looked up in man pages (none installed in a container).
    # --recursive-errors=one: the units named and their direct dependencies (the oneshots the
    # workers require); the distribution's own units further down are not this test's business.
    return analyze(systemd_analyze, work, "verify", "--man=no", "--recursive-errors=one", *units)


def parse_unit(text: str) -> Unit:
    """Sections of a unit file as systemd reads them: continuations joined, comments dropped."""
    sections: Unit = {}
    section = ""
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", ";")) or (not line and pending is None):
            continue  # comment lines inside a continued line are skipped too
        if line.endswith("\\"):
            pending = (pending or "") + line[:-1] + " "
            continue
        line, pending = (pending or "") + line, None
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            sections.setdefault(section, [])
            continue
        key, _, value = line.partition("=")
        sections[section].append((key.strip(), value.strip()))
    return sections


def unit(name: str) -> Unit:
    return parse_unit((SYSTEMD_DIR / name).read_text())


def values(parsed: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in parsed.get(section, []) if k == key]


def value(parsed: Unit, section: str, key: str) -> str:
    found = values(parsed, section, key)
    assert len(found) == 1, f"[{section}] {key}= is set {len(found)} times, expected once"
    return found[0]


def words(parsed: Unit, section: str, key: str) -> list[str]:
    """Space-separated list settings (After=, Requires=, ...) over all their lines."""
    return [w for v in values(parsed, section, key) for w in v.split()]


def exec_argv(parsed: Unit, key: str = "ExecStart") -> list[str]:
    return shlex.split(value(parsed, "Service", key))


def flag_value(argv: Sequence[str], flag: str) -> str:
    assert flag in argv, f"{flag} is not passed"
    return argv[argv.index(flag) + 1]


def environment(parsed: Unit) -> dict[str, str]:
    assignments = [item for v in values(parsed, "Service", "Environment") for item in v.split()]
    return dict(item.split("=", 1) for item in assignments)


def seconds(timespan: str) -> float:
    """A systemd time span such as ``30``, ``90s``, ``15min`` or ``1h``, in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for number, suffix in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", timespan):
        total += float(number) * units[suffix]
    return total


# --- systemd-analyze ------------------------------------------------------------------------


def test_units_verify_clean(systemd_analyze: str, tmp_path: Path) -> None:
    """systemd-analyze verify loads every shipped unit and has nothing to say about any."""
    result = verify(systemd_analyze, render(tmp_path))
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not output, output


@pytest.mark.parametrize(
    ("edits", "drop", "expected"),
    [
        # A flag line of vllm.service that loses its continuation: the next flags become garbage.
        ([(VLLM, "--port 8100 \\\n", "--port 8100\n")], (), "Missing '='"),
        ([(WORKER, "Restart=always", "Restart=sometimes")], (), "restart specifier"),
        ([(WORKER, "LimitNOFILE=65536", "LimitNOFILES=65536")], (), "Unknown key"),
        ([], (MIGRATE,), "chatsite-migrate.service not found"),
        ([(VLLM, "/usr/bin/curl", "/nonexistent/curl")], (), "is not executable"),
    ],
    ids=["broken-continuation", "bad-value", "unknown-key", "missing-dependency", "bad-command"],
)
def test_verify_reports_broken_units(
    systemd_analyze: str,
    tmp_path: Path,
    edits: list[Edit],
    drop: tuple[str, ...],
    expected: str,
) -> None:
    """The same invocation reports a broken unit, so a clean run above means something."""
    units = [u for u in VERIFIED if u not in drop]
    result = verify(systemd_analyze, render(tmp_path, edits, drop), units)
    output = result.stdout + result.stderr
    assert expected in output, output


@pytest.mark.parametrize(
    ("name", "threshold"),
    [*((u, CHATSITE_MAX_EXPOSURE) for u in CHATSITE_UNITS), (VLLM, VLLM_MAX_EXPOSURE)],
)
def test_units_are_hardened(
    systemd_analyze: str, tmp_path: Path, name: str, threshold: float
) -> None:
    """systemd-analyze security rates each unit's sandbox at or below its threshold."""
    work = render(tmp_path)
    result = analyze(
        systemd_analyze,
        work,
        "security",
        "--offline=yes",
        "--no-pager",
        f"--threshold={int(threshold * 10)}",
        name,
    )
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert score, result.stdout + result.stderr
    assert result.returncode == 0 and float(score.group(1)) <= threshold, result.stdout


def test_hardening_regression_is_caught(systemd_analyze: str, tmp_path: Path) -> None:
    """A worker stripped of its sandbox exceeds the threshold: the check above can fail."""
    hardening = (
        r"^(NoNewPrivileges|ProtectSystem|PrivateDevices|CapabilityBoundingSet|SystemCall\w+)="
    )
    text = (SYSTEMD_DIR / WORKER).read_text()
    stripped = "\n".join(line for line in text.splitlines() if not re.match(hardening, line))
    work = render(tmp_path, [(WORKER, text, stripped)])
    result = analyze(
        systemd_analyze,
        work,
        "security",
        "--offline=yes",
        "--no-pager",
        f"--threshold={int(CHATSITE_MAX_EXPOSURE * 10)}",
        "chatsite@8001.service",
    )
    assert result.returncode != 0, result.stdout


# --- the chatsite units ---------------------------------------------------------------------


def test_worker_runs_daphne_on_loopback_at_its_instance_port() -> None:
    """Each instance is Daphne (chatsite's, with its request deadline) on 127.0.0.1:%i behind
    nginx, restarted when it dies."""
    worker = unit(WORKER)
    argv = exec_argv(worker)
    assert argv[:3] == ["/srv/chatsite/.venv/bin/python", "-m", "chatsite.server"]
    assert flag_value(argv, "-b") == "127.0.0.1"
    assert flag_value(argv, "-p") == "%i"
    assert "--proxy-headers" in argv
    assert argv[-1] == "chatsite.asgi:application"
    # Daphne ends any response still streaming after --http-timeout seconds.
    assert not {"-t", "--http-timeout"} & set(argv)
    assert value(worker, "Service", "WorkingDirectory") == "/srv/chatsite"
    assert value(worker, "Service", "EnvironmentFile") == "/etc/chatsite/env"
    assert value(worker, "Service", "Restart") in {"always", "on-failure"}
    assert 0 < seconds(value(worker, "Service", "RestartSec")) <= 5
    assert value(worker, "Service", "KillSignal") == "SIGTERM"
    # Above the drain (CHATSITE_DRAIN_S, 25 s by default) and the cleanup after it.
    assert seconds(value(worker, "Service", "TimeoutStopSec")) >= 25 + 10
    assert int(value(worker, "Service", "LimitNOFILE")) >= 16384
    assert value(worker, "Service", "User") == "chatsite"
    for key, expected in SANDBOX.items():
        assert value(worker, "Service", key) == expected, key
    assert "chatsite.target" in words(worker, "Unit", "PartOf")
    assert "chatsite.target" in words(worker, "Install", "WantedBy")


def test_uvicorn_worker_is_the_daphne_worker_but_for_its_command() -> None:
    """chatsite-uvicorn@.service runs chatsite's uvicorn worker on 127.0.0.1:%i, and every other
    line (dependencies, restarts, the stop timeout above the drain, the sandbox) is
    chatsite@.service's: one cannot be hardened or mended without the other."""
    daphne, uvicorn = unit(WORKER), unit(UVICORN_WORKER)
    argv = exec_argv(uvicorn)
    assert argv[:3] == ["/srv/chatsite/.venv/bin/python", "-m", "chatsite.uvicorn_server"]
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "%i"
    own = {("Unit", "Description"), ("Service", "ExecStart")}

    def shared(parsed: Unit) -> dict[str, list[tuple[str, str]]]:
        return {
            section: [(k, v) for k, v in lines if (section, k) not in own]
            for section, lines in parsed.items()
        }

    assert shared(uvicorn) == shared(daphne)
    assert "uvicorn" in value(uvicorn, "Unit", "Description")


def test_nginx_upstream_lists_the_verified_instances() -> None:
    """The instances verified here are the workers nginx's upstream proxies to."""
    site = (ROOT / "deploy" / "nginx" / "chatsite.conf").read_text()
    upstream = re.search(r"upstream chatsite \{(.*?)\}", site, re.S)
    assert upstream, "deploy/nginx/chatsite.conf has no upstream chatsite"
    ports = re.findall(r"^\s*server 127\.0\.0\.1:(\d+)", upstream.group(1), re.M)
    assert {f"chatsite@{p}.service" for p in ports} <= set(VERIFIED)


def test_oneshots_run_once_per_group_before_the_workers() -> None:
    """Migrations and the metrics directory run once per group start, before any worker."""
    worker = unit(WORKER)
    for name in (MIGRATE, METRICS_DIR):
        oneshot = unit(name)
        assert name in words(worker, "Unit", "Requires")
        assert name in words(worker, "Unit", "After")
        assert value(oneshot, "Service", "Type") == "oneshot"
        # Without it a worker's automatic restart would run the oneshot again.
        assert value(oneshot, "Service", "RemainAfterExit") == "yes"
        assert "chatsite.target" in words(oneshot, "Unit", "PartOf")
        assert value(oneshot, "Service", "EnvironmentFile") == "/etc/chatsite/env"
        for key, expected in SANDBOX.items():
            assert value(oneshot, "Service", key) == expected, f"{name}: {key}"
    assert exec_argv(unit(MIGRATE))[1:] == ["manage.py", "migrate", "--noinput"]
    # Per-worker start steps would race (migrations) or wipe the siblings' metrics.
    assert not values(worker, "Service", "ExecStartPre")


def _timed_oneshot(service: Unit, name: str, argv: list[str]) -> None:
    """A timer's oneshot: ``argv`` with the workers' environment file, in their sandbox, below
    them; not RemainAfterExit, so that the timer can start it again."""
    assert value(service, "Service", "Type") == "oneshot"
    assert not values(service, "Service", "RemainAfterExit")
    assert exec_argv(service)[1:] == argv
    assert value(service, "Service", "EnvironmentFile") == "/etc/chatsite/env"
    assert int(value(service, "Service", "Nice")) > 0
    for key, expected in SANDBOX.items():
        assert value(service, "Service", key) == expected, f"{name}: {key}"


def test_pruning_runs_nightly_with_the_workers_environment(systemd_analyze: str) -> None:
    """chatsite-prune.timer starts the prune oneshot every night (a night missed while the host
    was down at the next boot); the service runs ``manage.py prune`` with the workers'
    environment file, in the same sandbox, below them."""
    timer, service = unit(PRUNE_TIMER), unit(PRUNE)
    assert value(timer, "Timer", "Unit") == PRUNE
    assert value(timer, "Timer", "Persistent") == "yes"
    assert "timers.target" in words(timer, "Install", "WantedBy")
    calendar = analyze(systemd_analyze, ROOT, "calendar", value(timer, "Timer", "OnCalendar"))
    assert calendar.returncode == 0, calendar.stderr
    assert re.search(r"Next elapse: .* 03:30:00", calendar.stdout), calendar.stdout
    _timed_oneshot(service, PRUNE, ["manage.py", "prune"])


def test_the_dashboards_sums_are_kept_up_every_five_minutes(systemd_analyze: str) -> None:
    """chatsite-traffic-sum.timer starts its oneshot every five minutes; the service runs
    ``manage.py traffic_sum`` with the workers' environment, in the same sandbox, below them."""
    timer, service = unit(SUMS_TIMER), unit(SUMS)
    assert value(timer, "Timer", "Unit") == SUMS
    assert "timers.target" in words(timer, "Install", "WantedBy")
    calendar = analyze(
        systemd_analyze, ROOT, "calendar", "--iterations=3", value(timer, "Timer", "OnCalendar")
    )
    assert calendar.returncode == 0, calendar.stderr
    elapses = re.findall(r"\d\d:(\d\d):00", calendar.stdout)
    minutes = [int(m) for m in elapses]
    assert len(minutes) >= 3 and all(m % 5 == 0 for m in minutes), calendar.stdout
    assert len(set(minutes)) == len(minutes), calendar.stdout
    _timed_oneshot(service, SUMS, ["manage.py", "traffic_sum"])


def test_metrics_directory_is_shared_and_owned_by_the_oneshot() -> None:
    """The workers share the directory the oneshot creates; no worker creates or removes it."""
    worker, owner, migrate = unit(WORKER), unit(METRICS_DIR), unit(MIGRATE)
    directory = "/run/" + value(owner, "Service", "RuntimeDirectory")
    assert environment(owner)["PROMETHEUS_MULTIPROC_DIR"] == directory
    assert environment(worker)["PROMETHEUS_MULTIPROC_DIR"] == directory
    assert directory in words(worker, "Service", "ReadWritePaths")
    # A RuntimeDirectory= of the worker's own would be removed whenever one worker stops.
    assert not values(worker, "Service", "RuntimeDirectory")
    assert exec_argv(owner)[1:] == ["manage.py", "metrics_reset"]
    assert "PROMETHEUS_MULTIPROC_DIR" in words(migrate, "Service", "UnsetEnvironment")
    # The environment file would override the units' Environment= lines.
    assert "PROMETHEUS_MULTIPROC_DIR" not in env_file(ENV_EXAMPLE.read_text())


def test_model_process_serves_every_worker_on_the_socket_it_owns() -> None:
    """One supervised model process per host: ready only once loaded, ordered before the
    workers, its socket in its own runtime directory under the path the workers are given,
    its restarts counted in the workers' metrics directory."""
    model, worker = unit(MODEL), unit(WORKER)
    assert exec_argv(model)[1:] == ["-m", "assistant.modelhost"]
    assert value(model, "Service", "Type") == "notify"
    assert value(model, "Service", "NotifyAccess") == "main"
    # SIGTERM to the supervisor alone: it stops the model process and removes the socket.
    assert value(model, "Service", "KillMode") == "mixed"
    socket_path = environment(model)["CHATSITE_MODEL_SOCKET"]
    assert socket_path == environment(worker)["CHATSITE_MODEL_SOCKET"]
    assert Path(socket_path).parent == Path("/run") / value(model, "Service", "RuntimeDirectory")
    assert MODEL in words(worker, "Unit", "After")
    assert MODEL not in words(worker, "Unit", "Requires")  # not needed with vLLM
    directory = "/run/" + value(unit(METRICS_DIR), "Service", "RuntimeDirectory")
    assert environment(model)["PROMETHEUS_MULTIPROC_DIR"] == directory
    assert directory in words(model, "Service", "ReadWritePaths")
    assert METRICS_DIR in words(model, "Unit", "Requires")
    assert "chatsite.target" in words(model, "Unit", "PartOf")
    assert "chatsite.target" in words(model, "Install", "WantedBy")
    assert int(value(model, "Service", "OOMScoreAdjust")) > 0
    for key, expected in SANDBOX.items():
        assert value(model, "Service", key) == expected, key


# --- vllm.service ---------------------------------------------------------------------------


def vllm_flags(argv: Sequence[str]) -> list[str]:
    return [word for word in argv if word.startswith("--")]


def test_vllm_serves_on_loopback_with_the_ttft_flags() -> None:
    """vllm serve binds 127.0.0.1:8100 with every flag that matters for TTFT, and none harmful."""
    vllm = unit(VLLM)
    argv = exec_argv(vllm)
    assert argv[:3] == ["/srv/vllm/.venv/bin/vllm", "serve", "${VLLM_MODEL}"]
    assert set(VLLM_REQUIRED_FLAGS) <= set(argv)
    assert flag_value(argv, "--host") == "127.0.0.1"
    for flag, why in VLLM_FORBIDDEN_FLAGS.items():
        assert flag not in argv, f"{flag}: {why}"
    assert 0.5 <= float(flag_value(argv, "--gpu-memory-utilization")) <= 0.95
    assert value(vllm, "Service", "Restart") in {"always", "on-failure"}
    # Loading a model takes minutes; the readiness probe holds the start until /health answers.
    assert seconds(value(vllm, "Service", "TimeoutStartSec")) >= 600
    probe = exec_argv(vllm, "ExecStartPost")
    port = flag_value(argv, "--port")
    assert probe[-1] == f"http://127.0.0.1:{port}/health"
    # The GPU must stay reachable.
    assert not values(vllm, "Service", "PrivateDevices")
    assert not values(vllm, "Service", "ProtectClock")


def test_every_vllm_flag_is_explained() -> None:
    """Each flag of vllm serve sits under a comment in the unit and is described in docs/vllm.md."""
    lines = (SYSTEMD_DIR / VLLM).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    doc = VLLM_DOC.read_text()
    seen = []
    previous = lines[start]
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if stripped.startswith("--"):
            flag = stripped.split()[0]
            seen.append(flag)
            assert previous.startswith(("#", "--")), f"{flag} has no comment above it"
            assert f"`{flag}" in doc, f"{flag} is not described in docs/vllm.md"
        if not line.rstrip().endswith("\\") and not stripped.startswith("#"):
            break
        previous = stripped
    assert seen == vllm_flags(exec_argv(unit(VLLM)))


def test_chatsite_and_prometheus_point_at_the_served_model() -> None:
    """env.example's URL and model, and Prometheus's vllm target, match what vllm.service serves."""
    vllm = unit(VLLM)
    argv = exec_argv(vllm)
    host, port = flag_value(argv, "--host"), int(flag_value(argv, "--port"))
    env = env_file(ENV_EXAMPLE.read_text())
    url = urlsplit(env["CHATSITE_VLLM_URL"])
    assert (url.hostname, url.port, url.path) == (host, port, "/v1")
    assert env["CHATSITE_VLLM_MODEL"] == environment(vllm)["VLLM_MODEL"]
    jobs = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    targets = [
        target
        for job in jobs
        if job["job_name"] == "vllm"
        for group in job["static_configs"]
        for target in group["targets"]
    ]
    assert f"{host}:{port}" in targets


# --- deploy/env.example ---------------------------------------------------------------------

ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$")


def env_file(text: str) -> dict[str, str]:
    """The variables an environment file sets (commented-out examples not included)."""
    found = {}
    for line in text.splitlines():
        match = ASSIGNMENT.match(line)
        if match and not match.group(1):
            found[match.group(2)] = match.group(3)
    return found


def env_documented(text: str) -> set[str]:
    """Every variable env.example sets or shows, commented out, with its default."""
    return {m.group(2) for line in text.splitlines() if (m := ASSIGNMENT.match(line))}


def env_names_read(path: Path) -> set[str]:
    """Environment variables a module reads: env_*() helpers, os.environ and os.getenv.

    ``f"{prefix}NAME"`` is expanded with every literal the module passes as ``prefix`` to the
    function that has it as a parameter (``engine_config("CHATSITE_CANDIDATE_", ...)``). A name
    this cannot work out fails the test rather than going unchecked.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names: set[str] = set()

    def reader_argument(node: ast.AST) -> ast.expr | None:
        if isinstance(node, ast.Subscript) and _dotted(node.value) in {"os.environ", "environ"}:
            return node.slice
        if not isinstance(node, ast.Call) or not node.args:
            return None
        func = _dotted(node.func)
        if re.fullmatch(r"env_\w+", func) or func in {
            "os.environ.get",
            "environ.get",
            "os.getenv",
            "getenv",
        }:
            return node.args[0]
        return None

    for node in ast.walk(tree):
        arg = reader_argument(node)
        if arg is None:
            continue
        where = f"{path.name}:{node.lineno}"
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.JoinedStr):
            names |= _expand(tree, parents, node, arg, where)
        else:
            pytest.fail(f"{where}: cannot tell which environment variable this reads")
    return names


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _expand(tree: ast.Module, parents: dict, node: ast.AST, fstring: ast.JoinedStr, where: str):
    parts = fstring.values
    if not (
        len(parts) == 2
        and isinstance(parts[0], ast.FormattedValue)
        and isinstance(parts[0].value, ast.Name)
        and isinstance(parts[1], ast.Constant)
    ):
        pytest.fail(f'{where}: only f"{{prefix}}NAME" can be expanded')
    param, suffix = parts[0].value.id, parts[1].value
    function = node
    while not isinstance(function, ast.FunctionDef):
        function = parents.get(function)
        if function is None:
            pytest.fail(f"{where}: {{{param}}} is not a function parameter")
    position = [a.arg for a in function.args.args].index(param)
    prefixes = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and _dotted(call.func) == function.name:
            given = dict(enumerate(call.args)) | {k.arg: k.value for k in call.keywords}
            literal = given.get(position, given.get(param))
            if not (isinstance(literal, ast.Constant) and isinstance(literal.value, str)):
                pytest.fail(f"{where}: a call of {function.name}() passes no literal {param}")
            prefixes.add(literal.value)
    if not prefixes:
        pytest.fail(f"{where}: {function.name}() is never called")
    return {prefix + suffix for prefix in prefixes}


def names_read() -> set[str]:
    return set().union(*(env_names_read(path) for path in ENV_READERS))


def excluded(name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in NOT_FOR_PRODUCTION)


def test_env_example_lists_every_variable_chatsite_reads() -> None:
    """Every variable settings.py, asgi.py or event_loop.py reads is in env.example, test-only
    ones aside."""
    read = names_read()
    documented = env_documented(ENV_EXAMPLE.read_text())
    missing = sorted(name for name in read - documented if not excluded(name))
    assert not missing, f"deploy/env.example does not mention {missing}"
    # The exclusions name variables that exist, so the list cannot go stale unnoticed.
    for pattern in NOT_FOR_PRODUCTION:
        assert any(re.fullmatch(pattern, name) for name in read), f"{pattern} matches nothing"


def test_env_example_lists_nothing_chatsite_ignores() -> None:
    """Every variable in env.example is one chatsite reads: no stale or misspelt names."""
    stale = sorted(env_documented(ENV_EXAMPLE.read_text()) - names_read())
    assert not stale, f"chatsite reads none of {stale}"


def test_scanner_finds_prefixed_and_plain_reads() -> None:
    """The settings scan sees plain reads and both expansions of the engine prefix."""
    read = names_read()
    assert {"DJANGO_SECRET_KEY", "CHATSITE_PROFILE", "PROMETHEUS_MULTIPROC_DIR"} <= read
    assert {"CHATSITE_VLLM_URL", "CHATSITE_CANDIDATE_VLLM_URL"} <= read


def test_env_example_explains_every_variable() -> None:
    """Each variable, or group of variables, comes right after a comment that explains it."""
    paragraph_has_prose = False
    for number, line in enumerate(ENV_EXAMPLE.read_text().splitlines(), start=1):
        if not line.strip():
            paragraph_has_prose = False
        elif ASSIGNMENT.match(line):
            assert paragraph_has_prose, f"env.example:{number}: {line!r} has no comment above it"
        elif line.startswith("#") and not line.lstrip("# ").startswith("---"):
            paragraph_has_prose = True


def test_env_example_holds_no_secrets() -> None:
    """Secrets are shipped empty or as an obvious placeholder."""
    env = env_file(ENV_EXAMPLE.read_text())
    for name in SECRETS:
        assert env[name] == "" or PLACEHOLDER in env[name], f"{name}={env[name]!r}"


def load_settings(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Import chatsite.settings in a fresh process with exactly ``env`` (plus PATH)."""
    script = (
        "import json, chatsite.settings as s\n"
        "print(json.dumps({'debug': s.DEBUG, 'tls': s.TLS, 'hosts': s.ALLOWED_HOSTS,"
        " 'database': s.DATABASES['default']['ENGINE'],"
        " 'cache': s.CACHES['default']['BACKEND'],"
        " 'engine': s.CHATSITE_ENGINES['default']}))\n"
    )
    return settings_run(script, env)


def test_env_example_as_shipped_refuses_to_start() -> None:
    """A copy whose secret key was not filled in is refused, naming the key."""
    result = load_settings(env_file(ENV_EXAMPLE.read_text()))
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr


def test_env_example_filled_in_is_the_production_profile() -> None:
    """With a secret key, env.example loads as production: no debug, PostgreSQL, Redis, vLLM."""
    env = env_file(ENV_EXAMPLE.read_text()) | {"DJANGO_SECRET_KEY": "s" * 50}
    result = load_settings(env)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["debug"] is False and loaded["tls"] is True
    assert loaded["hosts"] == env["DJANGO_ALLOWED_HOSTS"].split(",")
    assert loaded["database"] == "django.db.backends.postgresql"
    assert loaded["cache"] == "assistant.cache.SharedRedisCache"
    assert loaded["engine"]["BACKEND"] == "assistant.engines.openai_http.OpenAIHTTPEngine"
    assert loaded["engine"]["OPTIONS"]["BASE_URL"] == env["CHATSITE_VLLM_URL"]
