// The streaming dashboard: time to first token on the baseline and candidate paths, live.
//
// The server pushes one `snapshot` event a second over EventSource (which reconnects by itself);
// every snapshot is drawn in place: figures by textContent, histograms by updating the existing
// Chart.js charts. Everything in a snapshot is treated as untrusted text, never as markup.
import "../vendor/chartjs/chart.umd.js";

// The UMD build registers itself on the global object when loaded as a module.
const { Chart } = globalThis;

const config = document.body.dataset;
const $ = (id) => document.getElementById(id);
const els = {
  windows: $("windows"),
  live: $("live"),
  generatedAt: $("generated-at"),
  ratio: $("ratio"),
  paths: $("paths"),
  histograms: $("histograms"),
  breakerState: $("breaker-state"),
  breakerSince: $("breaker-since"),
  breakerConfig: $("breaker-config"),
  breakerEvents: $("breaker-events"),
  splitCurrent: $("split-current"),
  splitForm: $("split-form"),
  splitPercent: $("split-percent"),
  splitMode: $("split-mode"),
  splitSave: $("split-save"),
  splitReset: $("split-reset"),
  splitStatus: $("split-status"),
  slowest: $("slowest"),
};

// Used only when a snapshot carries no breaker config of its own.
const DEFAULT_P95_RATIO = 1.2;
const DEFAULT_ERROR_MARGIN = 0.05;
// No snapshot for this long on an open connection: say so rather than show old figures as live.
const STALE_AFTER_MS = 5000;
// After the server refuses the stream (EventSource gives up on an HTTP error), try again.
const REOPEN_AFTER_MS = 5000;

const COLORS = { client: "#2f6fed", server: "#f79009" };
const BREAKER_TEXT = { closed: "closed", open: "open", half_open: "half open" };
const SERVER_STAGES = [
  ["parsed", "s-parse", "received → parsed"],
  ["engine_submitted", "s-submit", "parsed → engine submit"],
  ["engine_first_token", "s-engine", "engine submit → first token"],
  ["first_token_sent", "s-send", "first token → sent"],
  ["finished", "s-stream", "sent → finished"],
];
const CLIENT_STAGES = [
  ["ttfb", "c-ttfb", "fetch → first byte"],
  ["ttft", "c-ttft", "first byte → first token shown"],
  ["done", "c-done", "first token → done"],
];
// A browser that never saw a token reports how long it waited instead.
const CLIENT_GAVE_UP = [
  ["ttfb", "c-ttfb", "fetch → first byte"],
  ["waited", "c-wait", "waited, no token"],
];

Chart.defaults.font.family = "system-ui, sans-serif";
Chart.defaults.font.size = 14;
Chart.defaults.color = "#1d2433";

let currentWindow = config.window || "5m";
let source = null;
let reopenTimer = null;
let lastSnapshot = null;
let lastSnapshotAt = 0;
let splitDirty = false;
const cards = new Map(); // path name -> {root, stats, role, engine}
const charts = new Map(); // path name -> {chart, caption, key, range}
const drawn = { events: "", slowest: "", pathsKey: "" };

// ---- formatting -------------------------------------------------------------------------------

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

function fmtMs(v) {
  if (!isNum(v)) return "–";
  if (v < 10) return `${v.toFixed(1)} ms`;
  if (v < 1000) return `${Math.round(v)} ms`;
  return `${(v / 1000).toFixed(v < 10000 ? 2 : 1)} s`;
}

function fmtEdge(v) {
  if (v >= 1000) return `${+(v / 1000).toFixed(2)} s`;
  return `${+v.toFixed(v < 10 ? 1 : 0)}`;
}

const fmtRate = (v) => (isNum(v) ? `${(v * 100).toFixed(1)} %` : "–");
const fmtCount = (v) => (isNum(v) ? String(v) : "–");
const fmtRatio = (v) => (isNum(v) ? `×${v.toFixed(2)}` : "–");
const fmtPoints = (v) => (isNum(v) ? `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(1)} pts` : "–");

function fmtClock(iso) {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? d.toLocaleTimeString([], { hour12: false }) : "–";
}

function fmtAgo(iso, nowIso) {
  const then = iso ? Date.parse(iso) : NaN;
  const now = nowIso ? Date.parse(nowIso) : Date.now();
  if (Number.isNaN(then) || Number.isNaN(now)) return "";
  const s = Math.max(0, Math.round((now - then) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function cookie(name) {
  const match = document.cookie.match(new RegExp(`(?:^|; )${name}=([^;]*)`));
  return match ? decodeURIComponent(match[1]) : "";
}

function safeJSON(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// ---- live connection ----------------------------------------------------------------------------

const LIVE_TEXT = {
  connecting: "connecting…",
  live: "● live",
  stale: "no update for a while…",
  reconnecting: "reconnecting…",
  offline: "offline, retrying…",
};

function setLive(state) {
  els.live.dataset.state = state;
  setText(els.live, LIVE_TEXT[state]);
}

function connect(windowName) {
  clearTimeout(reopenTimer);
  if (source) source.close();
  currentWindow = windowName;
  document.body.dataset.window = windowName;
  for (const button of els.windows.querySelectorAll("button[data-window]")) {
    button.setAttribute("aria-pressed", String(button.dataset.window === windowName));
  }
  setLive("connecting");
  const url = `${config.eventsUrl}?window=${encodeURIComponent(windowName)}`;
  const es = new EventSource(url);
  source = es;
  es.addEventListener("snapshot", (event) => {
    const snapshot = safeJSON(event.data);
    if (es !== source || !snapshot) return;
    // A late frame from the previous window must not be drawn under the new one.
    if (snapshot.window && snapshot.window !== currentWindow) return;
    lastSnapshotAt = performance.now();
    setLive("live");
    draw(snapshot);
  });
  es.addEventListener("error", () => {
    if (es !== source) return;
    if (es.readyState === EventSource.CLOSED) {
      setLive("offline");
      reopenTimer = setTimeout(() => es === source && connect(currentWindow), REOPEN_AFTER_MS);
    } else {
      setLive("reconnecting");
    }
  });
}

setInterval(() => {
  if (els.live.dataset.state === "live" && performance.now() - lastSnapshotAt > STALE_AFTER_MS) {
    setLive("stale");
  }
}, 1000);

els.windows.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-window]");
  if (button && button.dataset.window !== currentWindow) connect(button.dataset.window);
});

// ---- drawing ----------------------------------------------------------------------------------

function pathNames(snapshot) {
  const paths = snapshot.paths || {};
  const names = [snapshot.baseline, snapshot.candidate].filter((n) => n && n in paths);
  for (const name of Object.keys(paths)) if (!names.includes(name)) names.push(name);
  return names;
}

function draw(snapshot) {
  lastSnapshot = snapshot;
  const names = pathNames(snapshot);
  const key = names.join("\n");
  if (key !== drawn.pathsKey) {
    // Paths appeared or went away (a configuration change): start the per-path parts afresh.
    drawn.pathsKey = key;
    for (const { chart } of charts.values()) chart.destroy();
    charts.clear();
    cards.clear();
    els.paths.replaceChildren();
    els.histograms.replaceChildren();
  }
  const label = els.windows.querySelector(`button[data-window="${CSS.escape(currentWindow)}"]`);
  setText(
    els.generatedAt,
    `${label ? label.title : currentWindow} · updated ${fmtClock(snapshot.generated_at)}`,
  );
  const range = binRange(snapshot.histogram);
  for (const name of names) {
    const stats = snapshot.paths[name] || {};
    drawPath(name, stats);
    drawHistogram(name, stats, snapshot.histogram, range);
  }
  drawRatio(snapshot);
  drawBreaker(snapshot.breaker, snapshot.generated_at);
  drawSplit(snapshot.split, snapshot.candidate, snapshot.baseline);
  drawSlowest(snapshot.slowest);

  const total = names.reduce((sum, n) => sum + ((snapshot.paths[n] || {}).requests || 0), 0);
  document.body.dataset.requests = String(total);
  document.body.dataset.snapshotAt = snapshot.generated_at || "";
  document.body.dataset.ready = "1";
}

// -- per path figures

function statCell(stat, className = "") {
  const cell = el("span", className);
  cell.dataset.stat = stat;
  cell.textContent = "–";
  return cell;
}

function kpi(label, main, detail) {
  const box = el("div", "kpi");
  box.append(el("span", "kpi-label", label), main);
  if (detail) box.append(detail);
  return box;
}

function buildCard(name) {
  const root = el("article", "path");
  root.id = `path-${name}`;
  root.dataset.path = name;
  const title = el("h3");
  const role = el("span", "role");
  const engine = el("span", "engine");
  title.append(el("span", "name", name), " ", role, " ", engine);

  const detail = (parts) => {
    const small = el("small", "kpi-detail");
    small.append(...parts);
    return small;
  };
  const kpis = el("div", "kpis");
  kpis.append(
    kpi("Requests", statCell("requests", "kpi-value")),
    kpi("Errors", statCell("error_rate", "kpi-value"), detail([statCell("errors"), " failed"])),
    kpi(
      "Abandoned",
      statCell("abandon_rate", "kpi-value"),
      detail([statCell("abandoned"), " left early"]),
    ),
    kpi(
      "Tokens arrived in bursts",
      statCell("buffered", "kpi-value"),
      detail(["of ", statCell("buffered_checked"), " checked"]),
    ),
  );

  const table = el("table", "ttft");
  const head = el("tr");
  for (const text of ["TTFT", "P50", "P95", "P99", "n"]) head.append(el("th", "", text));
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  for (const [side, text] of [
    ["server", "server"],
    ["client", "browser"],
  ]) {
    const row = el("tr");
    row.dataset.side = side;
    row.append(el("th", "", text));
    for (const q of ["p50", "p95", "p99", "count"]) {
      const td = el("td");
      td.append(statCell(`${side}_${q}`));
      row.append(td);
    }
    tbody.append(row);
  }
  table.append(thead, tbody);
  root.append(title, kpis, table);
  els.paths.append(root);

  const stats = {};
  for (const cell of root.querySelectorAll("[data-stat]")) stats[cell.dataset.stat] = cell;
  const card = { root, stats, role, engine };
  cards.set(name, card);
  return card;
}

function drawPath(name, stats) {
  const card = cards.get(name) || buildCard(name);
  card.root.dataset.role = stats.role || "";
  setText(card.role, stats.role || "");
  setText(card.engine, stats.engine ? `engine: ${stats.engine}` : "");
  const s = card.stats;
  setText(s.requests, fmtCount(stats.requests));
  setText(s.errors, fmtCount(stats.errors));
  setText(s.error_rate, fmtRate(stats.error_rate));
  setText(s.abandoned, fmtCount(stats.abandoned));
  setText(s.abandon_rate, fmtRate(stats.abandon_rate));
  setText(s.buffered, fmtCount(stats.buffered));
  setText(s.buffered_checked, fmtCount(stats.buffered_checked));
  for (const side of ["server", "client"]) {
    const q = stats[`${side}_ttft_ms`] || {};
    setText(s[`${side}_p50`], fmtMs(q.p50));
    setText(s[`${side}_p95`], fmtMs(q.p95));
    setText(s[`${side}_p99`], fmtMs(q.p99));
    setText(s[`${side}_count`], fmtCount(q.count));
  }
}

// -- candidate against baseline

function limits(breaker) {
  const c = (breaker && breaker.config) || {};
  return {
    p95: isNum(c.p95_ratio) ? c.p95_ratio : DEFAULT_P95_RATIO,
    points: (isNum(c.error_margin) ? c.error_margin : DEFAULT_ERROR_MARGIN) * 100,
  };
}

function drawRatio(snapshot) {
  const ratio = snapshot.ratio || {};
  const limit = limits(snapshot.breaker);
  const parts = [
    ["server_p95", "server P95", fmtRatio(ratio.server_p95), ratio.server_p95 > limit.p95],
    ["client_p95", "browser P95", fmtRatio(ratio.client_p95), ratio.client_p95 > limit.p95],
    [
      "error_rate_points",
      "errors",
      fmtPoints(ratio.error_rate_points),
      ratio.error_rate_points > limit.points,
    ],
  ];
  const warn = ratio.server_p95 > limit.p95 || ratio.error_rate_points > limit.points;
  els.ratio.dataset.warn = String(warn);
  els.ratio.title =
    `Candidate (${snapshot.candidate}) against baseline (${snapshot.baseline}); warning above ` +
    `×${limit.p95} server P95 or ${fmtPoints(limit.points)} error rate.`;
  const children = [el("span", "ratio-title", `${snapshot.candidate} vs ${snapshot.baseline}:`)];
  for (const [key, text, value, over] of parts) {
    const part = el("span", over ? "ratio-part over" : "ratio-part");
    const figure = el("b", "", value);
    figure.dataset.ratio = key;
    part.append(`${text} `, figure);
    children.push(part);
  }
  els.ratio.replaceChildren(...children);
}

// -- histograms

// The round edges (1, 2, 5 × 10^n), to the value they stand for; null for the others.
function roundEdge(v) {
  if (!(v > 0)) return null;
  const pow = 10 ** Math.floor(Math.log10(v) + 1e-9);
  const m = [1, 2, 5, 10].find((x) => Math.abs(v / pow - x) / x < 0.03);
  return m === undefined ? null : m * pow;
}

// The bins worth showing: those with any request on any path, a little margin, twelve at least
// (the same range for every chart, so that the paths line up).
function binRange(histogram) {
  const edges = (histogram && histogram.edges_ms) || [];
  const bins = Math.max(0, edges.length - 1);
  let first = bins;
  let last = -1;
  for (const sides of Object.values((histogram && histogram.counts) || {})) {
    for (const counts of Object.values(sides || {})) {
      (counts || []).forEach((n, i) => {
        if (n > 0) {
          first = Math.min(first, i);
          last = Math.max(last, i);
        }
      });
    }
  }
  if (last < 0) return { edges, start: 0, end: bins };
  let start = Math.max(0, first - 2);
  let end = Math.min(bins, last + 3);
  while (end - start < Math.min(bins, 12)) {
    if (end < bins) end += 1;
    if (end - start < Math.min(bins, 12) && start > 0) start -= 1;
  }
  return { edges, start, end };
}

function binTitle(edges, i) {
  const lo = edges[i];
  if (i >= edges.length - 2) return `≥ ${fmtMs(lo)}`;
  return `${fmtEdge(lo)}–${fmtMs(edges[i + 1])}`;
}

function buildChart(name) {
  const figure = el("figure", "histogram");
  figure.dataset.path = name;
  const caption = el("figcaption");
  const box = el("div", "chart-box");
  const canvas = el("canvas");
  canvas.id = `histogram-${name}`;
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `Time to first token histogram, ${name}`);
  box.append(canvas);
  figure.append(caption, box);
  els.histograms.append(figure);

  const entry = { chart: null, caption, key: "", range: { edges: [], start: 0, end: 0 } };
  // Bin i of the chart is bin start + i of the snapshot.
  const edgeIndex = (i) => entry.range.start + i;
  entry.chart = new Chart(canvas, {
    type: "bar",
    data: {
      labels: [],
      datasets: [
        { label: "browser", data: [], backgroundColor: COLORS.client },
        { label: "server", data: [], backgroundColor: COLORS.server },
      ],
    },
    options: {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      datasets: { bar: { categoryPercentage: 0.9, barPercentage: 1 } },
      scales: {
        x: {
          grid: { display: false },
          title: { display: true, text: "time to first token (bin start)" },
          ticks: {
            autoSkip: false,
            maxRotation: 0,
            callback: (value, index) => tickLabel(entry.range, edgeIndex(index)),
          },
        },
        y: {
          beginAtZero: true,
          title: { display: true, text: "requests" },
          ticks: { precision: 0 },
        },
      },
      plugins: {
        legend: { position: "top", align: "end" },
        tooltip: {
          callbacks: {
            title: (items) =>
              items.length ? binTitle(entry.range.edges, edgeIndex(items[0].dataIndex)) : "",
          },
        },
      },
    },
  });
  charts.set(name, entry);
  return entry;
}

// Few bins: every one is labelled. Many: the round ones (by the round value they stand for),
// or every few bins where too few edges are round.
function tickLabel({ edges, start, end }, i) {
  const v = edges[i];
  const open = i === edges.length - 2 ? "+" : "";
  const shown = end - start;
  if (shown <= 16) return `${fmtEdge(v)}${open}`;
  let rounds = 0;
  for (let j = start; j < end; j += 1) rounds += roundEdge(edges[j]) !== null;
  if (rounds >= 3) {
    const round = roundEdge(v);
    return round === null ? null : `${fmtEdge(round)}${open}`;
  }
  return (i - start) % Math.ceil(shown / 8) === 0 ? `${fmtEdge(v)}${open}` : null;
}

function drawHistogram(name, stats, histogram, range) {
  const entry = charts.get(name) || buildChart(name);
  const counts = (histogram && histogram.counts && histogram.counts[name]) || {};
  const chart = entry.chart;
  const { edges, start, end } = range;
  const key = `${start}:${end}:${edges.join(",")}`;
  if (key !== entry.key) {
    entry.key = key;
    entry.range = range;
    chart.data.labels = edges.slice(start, end).map((v) => fmtEdge(v));
  }
  const client = counts.client || [];
  const server = counts.server || [];
  const sum = (xs) => xs.reduce((a, b) => a + (b || 0), 0);
  chart.data.datasets[0].data = client.slice(start, end);
  chart.data.datasets[0].label = `browser (${sum(client)})`;
  chart.data.datasets[1].data = server.slice(start, end);
  chart.data.datasets[1].label = `server (${sum(server)})`;
  chart.update("none");
  const role = stats.role ? ` (${stats.role})` : "";
  setText(entry.caption, `${name}${role}${stats.engine ? ` · ${stats.engine}` : ""}`);
}

// -- breaker

function drawBreaker(breaker, now) {
  const b = breaker || {};
  const state = b.state || "";
  els.breakerState.dataset.state = state;
  setText(els.breakerState, BREAKER_TEXT[state] || state || "–");
  setText(els.breakerSince, b.since ? `since ${fmtClock(b.since)} (${fmtAgo(b.since, now)})` : "");

  const c = b.config || {};
  const rows = [
    ["Window", isNum(c.window_s) ? `${c.window_s} s` : "–"],
    ["Minimum samples", fmtCount(c.min_samples)],
    ["Trips above", isNum(c.p95_ratio) ? `×${c.p95_ratio} baseline P95` : "–"],
    ["Error margin", isNum(c.error_margin) ? `${fmtPoints(c.error_margin * 100)}` : "–"],
    ["Cooldown", isNum(c.cooldown_s) ? `${c.cooldown_s} s` : "–"],
  ];
  if (isNum(c.half_open_percent)) rows.push(["Share while half open", `${c.half_open_percent} %`]);
  const key = JSON.stringify(rows);
  if (els.breakerConfig.dataset.key !== key) {
    els.breakerConfig.dataset.key = key;
    els.breakerConfig.replaceChildren(
      ...rows.flatMap(([term, value]) => [el("dt", "", term), el("dd", "", value)]),
    );
  }

  const events = Array.isArray(b.events) ? b.events.slice() : [];
  const eventsKey = JSON.stringify(events);
  if (eventsKey === drawn.events) return;
  drawn.events = eventsKey;
  events.sort((x, y) => (Date.parse(y.at) || 0) - (Date.parse(x.at) || 0));
  if (!events.length) {
    els.breakerEvents.replaceChildren(el("li", "empty", "Nothing has happened yet."));
    return;
  }
  els.breakerEvents.replaceChildren(
    ...events.map((e) => {
      const li = el("li");
      li.dataset.kind = e.kind || "";
      const head = el("div", "event-head");
      const when = el("time", "", fmtClock(e.at));
      if (e.at) when.dateTime = e.at;
      const kind = el("span", "kind", (e.kind || "event").replaceAll("_", " "));
      head.append(when, " ", kind);
      if (e.breaker && e.breaker !== e.kind) {
        head.append(" → breaker ", el("span", "to", BREAKER_TEXT[e.breaker] || e.breaker));
      }
      if (e.actor) head.append(" ", el("span", "actor", `by ${e.actor}`));
      li.append(head);
      if (e.message) li.append(el("p", "message", e.message));
      return li;
    }),
  );
}

// -- split

function splitSummary(split, candidate, baseline) {
  if (!split) return "No split reported.";
  const mode = split.mode || "auto";
  let text;
  if (mode === "force_candidate") text = `Every new chat goes to the candidate (${candidate}).`;
  else if (mode === "force_baseline") text = `Every new chat goes to the baseline (${baseline}).`;
  else text = `${isNum(split.percent) ? split.percent : "–"} % of new chats go to ${candidate}.`;
  const effective = split.effective_percent;
  if (mode === "auto" && isNum(effective) && effective !== split.percent) {
    const breaker = BREAKER_TEXT[split.breaker] || split.breaker;
    text += ` In effect now: ${effective} %${breaker ? ` (breaker ${breaker})` : ""}.`;
  }
  const who = split.updated_by ? ` by ${split.updated_by}` : "";
  const when = split.updated_at ? ` at ${fmtClock(split.updated_at)}` : "";
  if (who || when) text += ` Changed${who}${when}.`;
  if (split.percent_source) text += ` Share from: ${split.percent_source}.`;
  return text;
}

function fillSplitForm(split) {
  if (!split) return;
  if (isNum(split.percent)) els.splitPercent.value = String(split.percent);
  if (split.mode) els.splitMode.value = split.mode;
}

function drawSplit(split, candidate, baseline) {
  const current = els.splitCurrent;
  current.dataset.mode = (split && split.mode) || "";
  setText(current, splitSummary(split, candidate, baseline));
  // Never overwrite what the teacher is typing or has chosen but not applied yet.
  const editing = [els.splitPercent, els.splitMode].includes(document.activeElement);
  if (!splitDirty && !editing) fillSplitForm(split);
}

function setSplitStatus(text, kind = "") {
  els.splitStatus.textContent = text;
  els.splitStatus.className = kind;
}

function csrfToken() {
  const field = els.splitForm.querySelector("input[name=csrfmiddlewaretoken]");
  return cookie("csrftoken") || (field ? field.value : "");
}

async function submitSplit(event) {
  event.preventDefault();
  const percent = Number(els.splitPercent.value);
  if (els.splitPercent.value.trim() === "" || !(percent >= 0 && percent <= 100)) {
    setSplitStatus("Enter a share between 0 and 100.", "error");
    return;
  }
  const mode = els.splitMode.value;
  els.splitSave.disabled = true;
  setSplitStatus("Saving…");
  let response;
  let payload;
  try {
    response = await fetch(config.splitUrl, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      credentials: "same-origin",
      body: JSON.stringify({ percent, mode }),
    });
    payload = safeJSON(await response.text());
  } catch {
    setSplitStatus("Could not reach the server. Nothing was changed.", "error");
    return;
  } finally {
    els.splitSave.disabled = false;
  }
  if (!response.ok || !payload || !payload.split) {
    const error = (payload && payload.error) || {};
    setSplitStatus(error.message || `The server answered ${response.status}.`, "error");
    return;
  }
  splitDirty = false;
  fillSplitForm(payload.split);
  const names = lastSnapshot || {};
  setText(els.splitCurrent, splitSummary(payload.split, names.candidate, names.baseline));
  setSplitStatus(`Saved at ${fmtClock(new Date().toISOString())}.`, "ok");
}

els.splitForm.addEventListener("input", () => {
  splitDirty = true;
});
els.splitForm.addEventListener("submit", submitSplit);
els.splitReset.addEventListener("click", () => {
  splitDirty = false;
  fillSplitForm(lastSnapshot && lastSnapshot.split);
  setSplitStatus("");
});

// -- slowest requests

function niceScale(max) {
  if (!(max > 0)) return { top: 100, step: 25 };
  const raw = max / 5;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= raw);
  return { top: Math.ceil(max / step) * step, step };
}

function track(kind, times, stages, top) {
  const bar = el("div", "track");
  bar.dataset.track = kind;
  let start = 0;
  for (const [key, className, label] of stages) {
    const end = times[key];
    if (!isNum(end)) continue;
    const seg = el("span", `seg ${className}`);
    seg.dataset.stage = key;
    seg.style.left = `${(Math.max(0, start) / top) * 100}%`;
    seg.style.width = `${(Math.max(0, end - start) / top) * 100}%`;
    seg.title = `${label}: ${fmtMs(end - start)} (at ${fmtMs(end)})`;
    bar.append(seg);
    start = end;
  }
  return bar;
}

function trackRow(label, bar, summary) {
  const row = el("div", "track-row");
  row.append(el("span", "track-label", label), bar, el("span", "track-sum", summary));
  return row;
}

function drawSlowest(rows) {
  const list = Array.isArray(rows) ? rows : [];
  const key = JSON.stringify(list);
  if (key === drawn.slowest) return;
  drawn.slowest = key;
  if (!list.length) {
    els.slowest.replaceChildren(el("p", "empty", "No requests in this window yet."));
    return;
  }
  const ends = list.flatMap((r) => [
    ...Object.values(r.server || {}),
    ...Object.values(r.client || {}),
  ]);
  const { top, step } = niceScale(Math.max(0, ...ends.filter(isNum)));

  const scale = el("div", "track-row scale");
  const axis = el("div", "axis");
  for (let t = 0; t <= top + step / 2; t += step) {
    const tick = el("span", "tick", fmtMs(t));
    tick.style.left = `${(t / top) * 100}%`;
    axis.append(tick);
  }
  scale.append(el("span", "track-label"), axis, el("span", "track-sum"));

  const children = [scale];
  for (const r of list) {
    const item = el("article", "slow");
    item.dataset.requestId = String(r.request_id || "");
    item.dataset.path = r.path || "";
    const meta = el("div", "slow-meta");
    const id = el("code", "rid", String(r.request_id || "").slice(0, 12));
    id.title = String(r.request_id || "");
    const outcome = el("span", "outcome", r.outcome || "?");
    outcome.dataset.outcome = r.outcome || "";
    meta.append(id, el("span", "tag", r.path || "?"), el("span", "muted", r.engine || ""), outcome);
    if (r.client_outcome && r.client_outcome !== r.outcome) {
      meta.append(el("span", "muted", `browser: ${r.client_outcome}`));
    }
    if (isNum(r.tokens)) meta.append(el("span", "muted", `${r.tokens} tokens`));
    if (r.buffered) meta.append(el("span", "bursty", "tokens in bursts"));
    meta.append(el("time", "muted", fmtClock(r.at)));
    item.append(meta);

    const server = r.server || {};
    item.append(
      trackRow(
        "server",
        track("server", server, SERVER_STAGES, top),
        `first token ${fmtMs(server.first_token_sent)} · end ${fmtMs(server.finished)}`,
      ),
    );
    if (r.client && !isNum(r.client.ttft) && isNum(r.client.waited)) {
      item.append(
        trackRow(
          "browser",
          track("client", r.client, CLIENT_GAVE_UP, top),
          `no token · waited ${fmtMs(r.client.waited)}`,
        ),
      );
    } else if (r.client) {
      item.append(
        trackRow(
          "browser",
          track("client", r.client, CLIENT_STAGES, top),
          `first token ${fmtMs(r.client.ttft)} · end ${fmtMs(r.client.done)}`,
        ),
      );
    } else {
      const none = el("div", "track none", "the browser did not report");
      none.dataset.track = "client";
      item.append(trackRow("browser", none, ""));
    }
    children.push(item);
  }
  els.slowest.replaceChildren(...children);
}

connect(currentWindow);
