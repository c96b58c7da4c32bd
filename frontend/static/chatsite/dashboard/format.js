// How the dashboard writes numbers, times and states. A missing or non-finite value shows "–".

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

export const BREAKER_TEXT = { closed: "closed", open: "open", half_open: "half open" };

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

export const fmtRate = (v) => (isNum(v) ? `${(v * 100).toFixed(1)} %` : "–");
export const fmtCount = (v) => (isNum(v) ? String(v) : "–");
export const fmtRatio = (v) => (isNum(v) ? `×${v.toFixed(2)}` : "–");
export const fmtPoints = (v) =>
  isNum(v) ? `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(1)} pts` : "–";

export function fmtClock(iso) {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? d.toLocaleTimeString([], { hour12: false }) : "–";
}

// How long before `nowIso` (the snapshot's own clock, else the browser's) `iso` was.
export function fmtAgo(iso, nowIso) {
  const then = iso ? Date.parse(iso) : NaN;
  const now = nowIso ? Date.parse(nowIso) : Date.now();
  if (Number.isNaN(then) || Number.isNaN(now)) return "";
  const s = Math.max(0, Math.round((now - then) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}
