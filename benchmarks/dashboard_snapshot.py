"""How long the staff dashboard's snapshot takes over a school's day of stream records.

Fills a database of its own on the PostgreSQL at 127.0.0.1:5432 (``chatsite_bench_dashboard``,
dropped first, left for a look afterwards) with ``--records`` stream records spread over the last
24 hours on the baseline, candidate and API paths, half from Daphne's workers and half from
uvicorn's (7 in 10 reported by their browser, 2 % failed, 5 % abandoned), then times
``traffic_snapshot`` for each window (the servers' figures included):

- **every record read**: the window read record by record, as every window was before the
  records were summed up (the baseline);
- **summing it up itself**: the first snapshot of the window with no sums stored yet, which sums
  up its settled minutes and hours and stores them (the dashboard without the timer);
- **then**: the snapshots after it (``--repeat``), which read the sums and only the rest record
  by record: what the dashboard pays about once a second.

And ``manage.py traffic_sum`` (``sums_ahead``): over the whole day with nothing summed up (once,
after an upgrade), and a run of the five-minute timer (the last 10 minutes and their hour summed
up again).

Usage: python benchmarks/dashboard_snapshot.py [--records 1000000] [--repeat 20] [--json FILE]
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATABASE = "chatsite_bench_dashboard"
SERVER = "postgres://postgres@127.0.0.1:5432"
os.environ["DJANGO_SETTINGS_MODULE"] = "chatsite.settings"
os.environ["DATABASE_URL"] = f"{SERVER}/{DATABASE}"
os.environ.setdefault("CHATSITE_SECRET_KEY", "dashboard-benchmark-only")

import django  # noqa: E402

BASE, CAND, API = "direct", "django", "api"

#: Records over the last 24 h: server TTFT about 60 ms and a long tail, the browser's 5-40 ms
#: more; the classes' owners, outcomes and buffering spread as a school's would be.
FILL = """
INSERT INTO assistant_streamrecord (
    request_id, created_at, owner_key, path, engine, server, outcome, error_code, tokens,
    client_outcome, parse_ms, queue_ms, engine_ttft_ms, server_ttft_ms, e2e_ms,
    client_ttft_ms, client_reported_at, buffered)
SELECT md5(i::text), now() - random() * interval '24 hours', 'session:' || (i %% 5000),
       (ARRAY['direct', 'direct', 'django', 'api'])[1 + i %% 4], 'scripted',
       (ARRAY['daphne', 'uvicorn'])[1 + (i / 4) %% 2],
       CASE WHEN i %% 50 = 0 THEN 'engine_error' WHEN i %% 20 = 1 THEN 'client_abort'
            ELSE 'ok' END, '', 20, CASE WHEN i %% 10 < 7 THEN 'ok' ELSE '' END,
       0.2, 0.3, s - 1, s, s + 400,
       CASE WHEN i %% 10 < 7 THEN s + 5 + random() * 35 END,
       CASE WHEN i %% 10 < 7 THEN now() END,
       CASE WHEN i %% 10 < 7 THEN i %% 97 = 0 END
FROM (SELECT i, 40 + 20 * random() - 30 * ln(1 - random()) AS s
      FROM generate_series(1, %s) AS i) AS numbers
"""


def database_fresh() -> None:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1000, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    database_fresh()
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from assistant.models import TrafficSum
    from assistant.services import dashboard
    from assistant.services.traffic_sums import minute_floor, sums_ahead

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        filled_ms, _ = timed(lambda: cursor.execute(FILL, [args.records]))
        cursor.execute("ANALYZE assistant_streamrecord")
    print(f"{args.records:,} records stored in {filled_ms / 1000:.1f} s", flush=True)

    def snapshot(window_s: int) -> dict[str, Any]:
        return dashboard.traffic_snapshot(window_s=window_s, baseline=BASE, candidate=CAND)

    rows = []
    for window, window_s in dashboard.WINDOWS.items():
        exact_up_to = dashboard.EXACT_UP_TO_S
        dashboard.EXACT_UP_TO_S = window_s  # every record read, as before the minutes
        baseline_ms, exact = timed(lambda s=window_s: snapshot(s))
        dashboard.EXACT_UP_TO_S = exact_up_to
        TrafficSum.objects.all().delete()  # nothing summed up yet
        first_ms, result = timed(lambda s=window_s: snapshot(s))
        then = [timed(lambda s=window_s: snapshot(s))[0] for _ in range(args.repeat)]
        requests = sum(path["requests"] for path in result["paths"].values())
        p95 = {
            "exact": exact["paths"][BASE]["server_ttft_ms"]["p95"],
            "snapshot": result["paths"][BASE]["server_ttft_ms"]["p95"],
        }
        assert set(result["servers"]) == {"daphne", "uvicorn"}, result["servers"]
        rows.append(
            {
                "window": window,
                "records": requests,
                "every_record_ms": round(baseline_ms, 1),
                "first_ms": round(first_ms, 1),
                "then_p50_ms": round(statistics.median(then), 1),
                "then_max_ms": round(max(then), 1),
                "percentiles": result["percentiles"],
                "baseline_p95_server_ms": p95,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    TrafficSum.objects.all().delete()
    whole_day_ms, spans = timed(sums_ahead)
    recent = minute_floor(timezone.now()) - timedelta(minutes=15)
    TrafficSum.objects.filter(start__gte=recent.replace(minute=0)).delete()
    run_ms, _ = timed(sums_ahead)
    timer = {"whole_day_ms": round(whole_day_ms, 1), "spans": spans, "a_run_ms": round(run_ms, 1)}
    print(json.dumps(timer), flush=True)
    print()
    print(
        "| window | records in it | every record read | summing it up itself | "
        "then, P50 / max | baseline P95 server: exact / shown |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        p95 = row["baseline_p95_server_ms"]
        print(
            f"| {row['window']} | {row['records']:,} | {row['every_record_ms']:,.0f} ms | "
            f"{row['first_ms']:,.0f} ms | {row['then_p50_ms']:.1f} / {row['then_max_ms']:.1f} ms "
            f"| {p95['exact']} / {p95['snapshot']} ms ({row['percentiles']}) |"
        )
    print(
        f"\nmanage.py traffic_sum: the whole day {whole_day_ms / 1000:.1f} s ({spans} spans); "
        f"a run of the timer (the last 15-75 minutes) {run_ms:.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"windows": rows, "traffic_sum": timer}, indent=2) + "\n")


if __name__ == "__main__":
    main()
