// How the dashboard writes numbers, times and states. A missing or non-finite value shows "–".
// Words and units come from the page's strings (its language); ms and s stay SI symbols.
import { t } from "../strings.js";

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

// The breaker's states (codes, as the server sends them) as words.
export const BREAKER_TEXT = {
  closed: t("breakerClosed"),
  open: t("breakerOpen"),
  half_open: t("breakerHalfOpen"),
};
// A path's role (codes, as sent) as a word.
export const ROLE_TEXT = {
  baseline: t("roleBaseline"),
  candidate: t("roleCandidate"),
  api: t("roleApi"),
};

export function fmtMs(v) {
  if (!isNum(v)) return "–";
  if (v < 10) return `${v.toFixed(1)} ms`;
  if (v < 1000) return `${Math.round(v)} ms`;
  return `${(v / 1000).toFixed(v < 10000 ? 2 : 1)} s`;
}

// A histogram bin edge in ms: no unit below a second, to keep axis labels short.
export function fmtEdge(v) {
  if (v >= 1000) return `${+(v / 1000).toFixed(2)} s`;
  return `${+v.toFixed(v < 10 ? 1 : 0)}`;
}

export const fmtPercent = (v) => t("percent", { n: v });
export const fmtSeconds = (v) => t("seconds", { n: v });
export const fmtRate = (v) => (isNum(v) ? fmtPercent((v * 100).toFixed(1)) : "–");
export const fmtCount = (v) => (isNum(v) ? String(v) : "–");
export const fmtRatio = (v) => (isNum(v) ? `×${v.toFixed(2)}` : "–");
export const fmtPoints = (v) =>
  isNum(v) ? t("points", { n: `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(1)}` }) : "–";

export function fmtClock(iso) {
  const d = iso ? new Date(iso) : null;
  if (!d || Number.isNaN(d.getTime())) return "–";
  return d.toLocaleTimeString(document.documentElement.lang || [], { hour12: false });
}

// How long before `nowIso` (the snapshot's own clock, else the browser's) `iso` was.
export function fmtAgo(iso, nowIso) {
  const then = iso ? Date.parse(iso) : NaN;
  const now = nowIso ? Date.parse(nowIso) : Date.now();
  if (Number.isNaN(then) || Number.isNaN(now)) return "";
  const s = Math.max(0, Math.round((now - then) / 1000));
  if (s < 90) return t("secondsAgo", { n: s });
  if (s < 90 * 60) return t("minutesAgo", { n: Math.round(s / 60) });
  return t("hoursAgo", { n: (s / 3600).toFixed(1) });
}
