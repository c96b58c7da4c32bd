// The model processes the serving paths use (the embedded model's, one per host): whether each
// is answering, how often it has been restarted and how it last ended.
import { t } from "../strings.js";
import { byId, el, setText } from "./dom.js";
import { fmtAgo, fmtClock, fmtCount } from "./format.js";

const STATE_TEXT = {
  up: t("engineAnswering"),
  starting: t("engineLoading"),
  down: t("engineRestarting"),
};

const els = { card: byId("engines-card"), list: byId("engines") };
let drawn = "";

function row(term, value) {
  return [el("dt", "", term), el("dd", "", value)];
}

export function drawEngines(engines, now) {
  const entries = Object.entries(engines || {});
  els.card.hidden = entries.length === 0;
  const rows = entries.flatMap(([alias, e]) => {
    const state = STATE_TEXT[e.state] || e.state || "–";
    const lines = [
      ...row(
        t("engineState", { alias }),
        e.code && e.state !== "up" ? `${state} (${e.code})` : state,
      ),
      ...row(t("engineRestarts"), fmtCount(e.restarts)),
    ];
    if (e.since) {
      const since = t("timeAgo", { time: fmtClock(e.since), ago: fmtAgo(e.since, now) });
      lines.push(...row(t("engineUpSince"), since));
    }
    if (e.last_exit) {
      const ended = e.last_exit_at
        ? t("engineEndedAt", { exit: e.last_exit, time: fmtClock(e.last_exit_at) })
        : e.last_exit;
      lines.push(...row(t("engineLastEnded"), ended));
    }
    if (e.state === "up") lines.push(...row(t("engineRequestsNow"), fmtCount(e.active)));
    return lines;
  });
  const key = JSON.stringify(rows.map((node) => node.textContent));
  if (key === drawn) return;
  drawn = key;
  els.list.replaceChildren(...rows);
  els.list.dataset.restarts = String(
    entries.reduce((sum, [, e]) => sum + (Number(e.restarts) || 0), 0),
  );
}
