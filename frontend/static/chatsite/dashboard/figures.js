// The figures drawn as text: a card per path, the candidate-against-baseline badge, and the
// circuit breaker's state, settings and event log.
import { t } from "../strings.js";
import { byId, el, setText, textWith } from "./dom.js";
import {
  BREAKER_TEXT,
  ROLE_TEXT,
  fmtAgo,
  fmtClock,
  fmtCount,
  fmtMs,
  fmtPercent,
  fmtPoints,
  fmtRate,
  fmtRatio,
  fmtSeconds,
  isNum,
} from "./format.js";

// The breaker log's kinds of event (codes) as words.
const EVENT_TEXT = {
  tripped: t("eventTripped"),
  half_open: t("eventHalfOpen"),
  closed: t("eventClosed"),
  reopened: t("eventReopened"),
  split_changed: t("eventSplitChanged"),
};

// Used only when a snapshot carries no breaker config of its own.
const DEFAULT_P95_RATIO = 1.2;
const DEFAULT_ERROR_MARGIN = 0.05;

const els = {
  ratio: byId("ratio"),
  paths: byId("paths"),
  breakerState: byId("breaker-state"),
  breakerSince: byId("breaker-since"),
  breakerConfig: byId("breaker-config"),
  breakerEvents: byId("breaker-events"),
};

const cards = new Map(); // path name -> {root, stats, role, engine}
let drawnEvents = "";

// ---- per path ---------------------------------------------------------------------------------

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
    kpi(t("kpiRequests"), statCell("requests", "kpi-value")),
    kpi(
      t("kpiErrors"),
      statCell("error_rate", "kpi-value"),
      detail(textWith("kpiFailed", { n: statCell("errors") })),
    ),
    kpi(
      t("kpiAbandoned"),
      statCell("abandon_rate", "kpi-value"),
      detail(textWith("kpiLeftEarly", { n: statCell("abandoned") })),
    ),
    kpi(
      t("kpiBursts"),
      statCell("buffered", "kpi-value"),
      detail(textWith("kpiChecked", { n: statCell("buffered_checked") })),
    ),
  );

  const table = el("table", "ttft");
  const head = el("tr");
  for (const text of [t("colTtft"), "P50", "P95", "P99", t("colCount")]) {
    head.append(el("th", "", text));
  }
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  for (const [side, text] of [
    ["server", t("server")],
    ["client", t("browser")],
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
  // Said only when the window's percentiles come from sums (services/traffic_sums.py).
  const caption = el("caption", "ttft-note");
  caption.hidden = true;
  table.append(caption, thead, tbody);
  root.append(title, kpis, table);
  els.paths.append(root);

  const stats = {};
  for (const cell of root.querySelectorAll("[data-stat]")) stats[cell.dataset.stat] = cell;
  const card = { root, stats, role, engine, caption };
  cards.set(name, card);
  return card;
}

// Draw one path's card, building it the first time; `percentiles` is the snapshot's ("exact",
// or "binned": taken from sums a minute and an hour long, within a 1.8 % bin).
export function drawPath(name, stats, percentiles) {
  const card = cards.get(name) || buildCard(name);
  card.root.dataset.role = stats.role || "";
  setText(card.role, ROLE_TEXT[stats.role] || stats.role || "");
  setText(card.engine, stats.engine ? t("engineName", { engine: stats.engine }) : "");
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
  const binned = percentiles === "binned";
  card.caption.hidden = !binned;
  setText(card.caption, binned ? t("percentilesBinned") : "");
  card.root.dataset.percentiles = percentiles || "";
}

// Remove every card, for when the set of paths changes.
export function clearPaths() {
  cards.clear();
  els.paths.replaceChildren();
}

// ---- candidate against baseline ---------------------------------------------------------------

function limits(breaker) {
  const c = (breaker && breaker.config) || {};
  return {
    p95: isNum(c.p95_ratio) ? c.p95_ratio : DEFAULT_P95_RATIO,
    points: (isNum(c.error_margin) ? c.error_margin : DEFAULT_ERROR_MARGIN) * 100,
  };
}

export function drawRatio(snapshot) {
  const ratio = snapshot.ratio || {};
  const limit = limits(snapshot.breaker);
  const parts = [
    ["server_p95", t("ratioServerP95"), fmtRatio(ratio.server_p95), ratio.server_p95 > limit.p95],
    ["client_p95", t("ratioBrowserP95"), fmtRatio(ratio.client_p95), ratio.client_p95 > limit.p95],
    [
      "error_rate_points",
      t("ratioErrors"),
      fmtPoints(ratio.error_rate_points),
      ratio.error_rate_points > limit.points,
    ],
  ];
  const warn = ratio.server_p95 > limit.p95 || ratio.error_rate_points > limit.points;
  els.ratio.dataset.warn = String(warn);
  els.ratio.title = t("ratioTitle", {
    candidate: snapshot.candidate,
    baseline: snapshot.baseline,
    p95: limit.p95,
    points: fmtPoints(limit.points),
  });
  const children = [
    el(
      "span",
      "ratio-title",
      t("ratioHeading", { candidate: snapshot.candidate, baseline: snapshot.baseline }),
    ),
  ];
  for (const [key, text, value, over] of parts) {
    const part = el("span", over ? "ratio-part over" : "ratio-part");
    const figure = el("b", "", value);
    figure.dataset.ratio = key;
    part.append(`${text} `, figure);
    children.push(part);
  }
  els.ratio.replaceChildren(...children);
}

// ---- breaker ----------------------------------------------------------------------------------

export function drawBreaker(breaker, now) {
  const b = breaker || {};
  const state = b.state || "";
  els.breakerState.dataset.state = state;
  setText(els.breakerState, BREAKER_TEXT[state] || state || "–");
  setText(
    els.breakerSince,
    b.since ? t("sinceAgo", { time: fmtClock(b.since), ago: fmtAgo(b.since, now) }) : "",
  );

  const c = b.config || {};
  const tripsAbove = isNum(c.p95_ratio) ? t("cfgTripsAboveValue", { ratio: c.p95_ratio }) : "–";
  const rows = [
    [t("cfgWindow"), isNum(c.window_s) ? fmtSeconds(c.window_s) : "–"],
    [t("cfgMinSamples"), fmtCount(c.min_samples)],
    [t("cfgTripsAbove"), tripsAbove],
    [t("cfgErrorMargin"), isNum(c.error_margin) ? `${fmtPoints(c.error_margin * 100)}` : "–"],
    [t("cfgCooldown"), isNum(c.cooldown_s) ? fmtSeconds(c.cooldown_s) : "–"],
  ];
  if (isNum(c.half_open_percent)) {
    rows.push([t("cfgHalfOpenShare"), fmtPercent(c.half_open_percent)]);
  }
  const key = JSON.stringify(rows);
  if (els.breakerConfig.dataset.key !== key) {
    els.breakerConfig.dataset.key = key;
    els.breakerConfig.replaceChildren(
      ...rows.flatMap(([term, value]) => [el("dt", "", term), el("dd", "", value)]),
    );
  }

  const events = Array.isArray(b.events) ? b.events.slice() : [];
  const eventsKey = JSON.stringify(events);
  if (eventsKey === drawnEvents) return;
  drawnEvents = eventsKey;
  events.sort((x, y) => (Date.parse(y.at) || 0) - (Date.parse(x.at) || 0));
  if (!events.length) {
    els.breakerEvents.replaceChildren(el("li", "empty", t("noEvents")));
    return;
  }
  els.breakerEvents.replaceChildren(
    ...events.map((e) => {
      const li = el("li");
      li.dataset.kind = e.kind || "";
      const head = el("div", "event-head");
      const when = el("time", "", fmtClock(e.at));
      if (e.at) when.dateTime = e.at;
      const kindText = EVENT_TEXT[e.kind] || (e.kind || t("eventFallback")).replaceAll("_", " ");
      const kind = el("span", "kind", kindText);
      head.append(when, " ", kind);
      if (e.breaker && e.breaker !== e.kind) {
        const to = el("span", "to", BREAKER_TEXT[e.breaker] || e.breaker);
        head.append(" ", ...textWith("eventToBreaker", { state: to }));
      }
      if (e.actor) head.append(" ", el("span", "actor", t("eventBy", { actor: e.actor })));
      li.append(head);
      if (e.message) li.append(el("p", "message", e.message));
      return li;
    }),
  );
}
