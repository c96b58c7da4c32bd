// The slowest recent requests: one row each, with the server's and the browser's stages drawn
// as bars on one time scale shared by every row.
import { t } from "../strings.js";
import { byId, el } from "./dom.js";
import { fmtClock, fmtMs, isNum } from "./format.js";

// [time key, segment class, label]: each stage runs from the previous key's time to its own.
const SERVER_STAGES = [
  ["parsed", "s-parse", t("stageParse")],
  ["engine_submitted", "s-submit", t("stageSubmit")],
  ["engine_first_token", "s-engine", t("stageEngine")],
  ["first_token_sent", "s-send", t("stageSend")],
  ["finished", "s-stream", t("stageStream")],
];
const CLIENT_STAGES = [
  ["ttfb", "c-ttfb", t("stageTtfb")],
  ["ttft", "c-ttft", t("stageTtft")],
  ["done", "c-done", t("stageDone")],
];
// A browser that never saw a token reports how long it waited instead.
const CLIENT_GAVE_UP = [
  ["ttfb", "c-ttfb", t("stageTtfb")],
  ["waited", "c-wait", t("stageWaited")],
];
// How requests ended (codes: the server's outcomes, then the browser's) as words.
const OUTCOME_TEXT = {
  ok: t("outcomeOk"),
  client_abort: t("outcomeClientAbort"),
  engine_error: t("outcomeEngineError"),
  timeout: t("outcomeTimeout"),
  server_error: t("outcomeServerError"),
  slow_client: t("outcomeSlowClient"),
  given_up: t("outcomeGivenUp"),
  error: t("outcomeError"),
  stopped: t("outcomeStopped"),
  abandoned: t("outcomeAbandoned"),
};
const outcomeText = (code) => OUTCOME_TEXT[code] || code;

const container = byId("slowest");
let drawnKey = "";

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
    seg.title = t("stageTitle", { label, duration: fmtMs(end - start), end: fmtMs(end) });
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

function scaleRow(top, step) {
  const scale = el("div", "track-row scale");
  const axis = el("div", "axis");
  for (let t = 0; t <= top + step / 2; t += step) {
    const tick = el("span", "tick", fmtMs(t));
    tick.style.left = `${(t / top) * 100}%`;
    axis.append(tick);
  }
  scale.append(el("span", "track-label"), axis, el("span", "track-sum"));
  return scale;
}

function requestItem(r, top) {
  const item = el("article", "slow");
  item.dataset.requestId = String(r.request_id || "");
  item.dataset.path = r.path || "";
  const meta = el("div", "slow-meta");
  const id = el("code", "rid", String(r.request_id || "").slice(0, 12));
  id.title = String(r.request_id || "");
  const outcome = el("span", "outcome", outcomeText(r.outcome) || "?");
  outcome.dataset.outcome = r.outcome || "";
  meta.append(id, el("span", "tag", r.path || "?"), el("span", "muted", r.engine || ""), outcome);
  if (r.client_outcome && r.client_outcome !== r.outcome) {
    const browserOutcome = t("browserOutcome", { outcome: outcomeText(r.client_outcome) });
    meta.append(el("span", "muted", browserOutcome));
  }
  if (isNum(r.tokens)) meta.append(el("span", "muted", t("tokens", { n: r.tokens })));
  if (r.buffered) meta.append(el("span", "bursty", t("tokensInBursts")));
  meta.append(el("time", "muted", fmtClock(r.at)));
  item.append(meta);

  const server = r.server || {};
  item.append(
    trackRow(
      t("server"),
      track("server", server, SERVER_STAGES, top),
      t("trackSummary", { ttft: fmtMs(server.first_token_sent), end: fmtMs(server.finished) }),
    ),
  );
  if (r.client && !isNum(r.client.ttft) && isNum(r.client.waited)) {
    item.append(
      trackRow(
        t("browser"),
        track("client", r.client, CLIENT_GAVE_UP, top),
        t("noTokenWaited", { waited: fmtMs(r.client.waited) }),
      ),
    );
  } else if (r.client) {
    item.append(
      trackRow(
        t("browser"),
        track("client", r.client, CLIENT_STAGES, top),
        t("trackSummary", { ttft: fmtMs(r.client.ttft), end: fmtMs(r.client.done) }),
      ),
    );
  } else {
    const none = el("div", "track none", t("browserDidNotReport"));
    none.dataset.track = "client";
    item.append(trackRow(t("browser"), none, ""));
  }
  return item;
}

// Redraw the list, only when the snapshot's rows differ from those on screen.
export function drawSlowest(rows) {
  const list = Array.isArray(rows) ? rows : [];
  const key = JSON.stringify(list);
  if (key === drawnKey) return;
  drawnKey = key;
  if (!list.length) {
    container.replaceChildren(el("p", "empty", t("noRequests")));
    return;
  }
  const ends = list.flatMap((r) => [
    ...Object.values(r.server || {}),
    ...Object.values(r.client || {}),
  ]);
  const { top, step } = niceScale(Math.max(0, ...ends.filter(isNum)));
  container.replaceChildren(scaleRow(top, step), ...list.map((r) => requestItem(r, top)));
}
