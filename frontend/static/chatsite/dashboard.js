// The streaming dashboard: time to first token on the baseline and candidate paths, live.
//
// The server pushes one `snapshot` event a second over EventSource (which reconnects by itself);
// every snapshot is drawn in place: figures by textContent, histograms by updating the existing
// Chart.js charts. Everything in a snapshot is treated as untrusted text, never as markup.
//
// This module owns the connection and the window picker; the parts of the page are drawn by the
// modules under ./dashboard/.
import { safeJSON } from "./stream.js";
import { t } from "./strings.js";
import { byId, setText } from "./dashboard/dom.js";
import { drawEngines } from "./dashboard/engines.js";
import { clearPaths, drawBreaker, drawPath, drawRatio } from "./dashboard/figures.js";
import { fmtClock } from "./dashboard/format.js";
import { binRange, clearHistograms, drawHistogram } from "./dashboard/histograms.js";
import { drawServers } from "./dashboard/servers.js";
import { drawSplit, setupSplitForm } from "./dashboard/split.js";
import { drawSlowest } from "./dashboard/waterfall.js";

const config = document.body.dataset;
const els = {
  windows: byId("windows"),
  live: byId("live"),
  generatedAt: byId("generated-at"),
};

// No snapshot for this long on an open connection: say so rather than show old figures as live.
const STALE_AFTER_MS = 5000;
// After the server refuses the stream (EventSource gives up on an HTTP error), try again.
const REOPEN_AFTER_MS = 5000;

const LIVE_TEXT = {
  connecting: t("liveConnecting"),
  live: t("liveLive"),
  stale: t("liveStale"),
  reconnecting: t("liveReconnecting"),
  offline: t("liveOffline"),
  forbidden: t("liveForbidden"),
};

let currentWindow = config.window || "5m";
let source = null;
let reopenTimer = null;
let lastSnapshotAt = 0;
let drawnPaths = ""; // the path names on screen, one a line

// ---- drawing ----------------------------------------------------------------------------------

// Baseline first, then candidate, then any other path the snapshot reports.
function pathNames(snapshot) {
  const paths = snapshot.paths || {};
  const names = [snapshot.baseline, snapshot.candidate].filter((n) => n && n in paths);
  for (const name of Object.keys(paths)) if (!names.includes(name)) names.push(name);
  return names;
}

function draw(snapshot) {
  const names = pathNames(snapshot);
  const key = names.join("\n");
  if (key !== drawnPaths) {
    // Paths appeared or went away (a configuration change): start the per-path parts afresh.
    drawnPaths = key;
    clearHistograms();
    clearPaths();
  }
  const label = els.windows.querySelector(`button[data-window="${CSS.escape(currentWindow)}"]`);
  setText(
    els.generatedAt,
    t("updatedAt", {
      window: label ? label.title : currentWindow,
      time: fmtClock(snapshot.generated_at),
    }),
  );
  const range = binRange(snapshot.histogram);
  for (const name of names) {
    const stats = snapshot.paths[name] || {};
    drawPath(name, stats, snapshot.percentiles);
    drawHistogram(name, stats, snapshot.histogram, range);
  }
  drawRatio(snapshot);
  drawBreaker(snapshot.breaker, snapshot.generated_at);
  drawEngines(snapshot.engines, snapshot.generated_at);
  drawServers(snapshot.servers, snapshot.servers_compared);
  drawSplit(snapshot.split, snapshot.candidate, snapshot.baseline);
  drawSlowest(snapshot.slowest);

  const total = names.reduce((sum, n) => sum + ((snapshot.paths[n] || {}).requests || 0), 0);
  document.body.dataset.requests = String(total);
  document.body.dataset.snapshotAt = snapshot.generated_at || "";
  document.body.dataset.ready = "1";
}

// ---- live connection --------------------------------------------------------------------------

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
  // The server checks now and then that the viewer is still staff; when not, it says so and
  // ends the stream: stop here instead of reconnecting to be refused.
  es.addEventListener("forbidden", () => {
    if (es !== source) return;
    es.close();
    source = null;
    setLive("forbidden");
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
setupSplitForm();

connect(currentWindow);
