"""aiperf's results read and joined with chatsite's own records of the same requests.

Pure: no server, no tool. ``benchmarks/openai_tools.py`` runs aiperf and the server and calls
these; aiperf's files (``profile_export.jsonl``, one line per request with the ``X-Request-ID``
it sent; ``profile_export_aiperf.json``, its aggregate) are read as aiperf 0.13.0 writes them.
"""

import json
from pathlib import Path
from typing import Any

from assistant.benchmarking import percentile


def profile_lines(artifacts: Path) -> list[dict[str, Any]]:
    """aiperf's per-request records of the measured phase (warm-up excluded)."""
    path = artifacts / "profile_export.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        line
        for line in lines
        if line.get("metadata", {}).get("benchmark_phase", "profiling") == "profiling"
    ]


def _stat(metric: dict[str, Any] | None, key: str) -> float | None:
    return None if not metric or metric.get(key) is None else float(metric[key])


def level_summary(
    concurrency: int,
    aggregate: dict[str, Any],
    lines: list[dict[str, Any]],
    records: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """One concurrency level: aiperf's aggregate figures, the server's records of the same
    requests (joined by X-Request-ID) and, per request, aiperf TTFT - server TTFT."""
    ok = [line for line in lines if "time_to_first_token" in line.get("metrics", {})]
    sent = [line["metadata"].get("x_request_id") for line in lines]
    joined = [
        (line, records[rid]) for line in ok if (rid := line["metadata"]["x_request_id"]) in records
    ]
    server = [record for _, record in joined if record["outcome"] == "ok"]

    def server_p(name: str, q: float) -> float | None:
        values = [r[name] for r in server if r[name] is not None]
        return round(percentile(values, q), 2) if values else None

    wire = [
        line["metrics"]["time_to_first_token"]["value"] - record["server_ttft_ms"]
        for line, record in joined
        if record["server_ttft_ms"] is not None
    ]
    outcomes: dict[str, int] = {}
    for rid in sent:
        outcome = records[rid]["outcome"] if rid in records else "no record"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {
        "concurrency": concurrency,
        "tool_requests": _stat(aggregate.get("request_count"), "avg"),
        "tool_requests_sent": len(lines),
        "tool_errors": len(lines) - len(ok),
        "tool_ttft_p50_ms": _stat(aggregate.get("time_to_first_token"), "p50"),
        "tool_ttft_p99_ms": _stat(aggregate.get("time_to_first_token"), "p99"),
        "tool_itl_p50_ms": _stat(aggregate.get("inter_token_latency"), "p50"),
        "tool_latency_p50_ms": _stat(aggregate.get("request_latency"), "p50"),
        "tool_osl_mean": _stat(aggregate.get("output_sequence_length"), "avg"),
        "tool_requests_per_s": _stat(aggregate.get("request_throughput"), "avg"),
        "server_requests": len(server),
        "server_outcomes": outcomes,
        "server_ttft_p50_ms": server_p("server_ttft_ms", 50),
        "server_ttft_p99_ms": server_p("server_ttft_ms", 99),
        "engine_ttft_p50_ms": server_p("engine_ttft_ms", 50),
        "server_itl_mean_p50_ms": server_p("itl_mean_ms", 50),
        "server_e2e_p50_ms": server_p("e2e_ms", 50),
        "server_tokens_mean": (
            round(sum(r["tokens"] for r in server) / len(server), 2) if server else None
        ),
        "wire_ttft_p50_ms": round(percentile(wire, 50), 2) if wire else None,
        "wire_ttft_p99_ms": round(percentile(wire, 99), 2) if wire else None,
        "counts_match": len(ok) == len(server) == len(lines),
    }


#: The printed table's rows: (label, key in a level's summary).
ROWS = [
    ("aiperf requests ok", "tool_requests"),
    ("server records ok", "server_requests"),
    ("aiperf TTFT P50", "tool_ttft_p50_ms"),
    ("aiperf TTFT P99", "tool_ttft_p99_ms"),
    ("server TTFT P50", "server_ttft_p50_ms"),
    ("server TTFT P99", "server_ttft_p99_ms"),
    ("engine TTFT P50", "engine_ttft_p50_ms"),
    ("aiperf - server TTFT P50", "wire_ttft_p50_ms"),
    ("aiperf - server TTFT P99", "wire_ttft_p99_ms"),
    ("aiperf ITL P50", "tool_itl_p50_ms"),
    ("server ITL mean P50", "server_itl_mean_p50_ms"),
    ("aiperf latency P50", "tool_latency_p50_ms"),
    ("server E2E P50", "server_e2e_p50_ms"),
    ("output tokens (mean)", "tool_osl_mean"),
    ("requests/s (aiperf)", "tool_requests_per_s"),
    ("aiperf CPU (s, whole run)", "tool_cpu_s"),
    ("aiperf wall (s, whole run)", "tool_wall_s"),
    ("server CPU (ms/answer, warm-up too)", "server_cpu_ms_per_answer"),
]


def table(levels: list[dict[str, Any]]) -> str:
    """Figures as rows, concurrency levels as columns; times in ms."""
    head = f"{'(ms unless stated)':36s}" + "".join(
        f"{'c=' + str(lv['concurrency']):>10s}" for lv in levels
    )
    lines = [head]
    for label, key in ROWS:
        cells = "".join(
            f"{'-':>10s}" if lv.get(key) is None else f"{lv[key]:10.1f}" for lv in levels
        )
        lines.append(f"{label:36s}{cells}")
    for lv in levels:
        if not lv["counts_match"]:
            lines.append(
                f"c={lv['concurrency']}: COUNTS DIFFER: aiperf sent {lv['tool_requests_sent']}, "
                f"{lv['tool_errors']} failed; server outcomes {lv['server_outcomes']}"
            )
    return "\n".join(lines)
