// The model processes the serving paths use (the embedded model's, one per host): whether each
// is answering, how often it has been restarted and how it last ended.
import { byId, el, setText } from "./dom.js";
import { fmtAgo, fmtClock, fmtCount } from "./format.js";

const STATE_TEXT = { up: "answering", starting: "loading", down: "restarting" };

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
      ...row(`${alias}: state`, e.code && e.state !== "up" ? `${state} (${e.code})` : state),
      ...row("Restarts", fmtCount(e.restarts)),
    ];
    if (e.since) lines.push(...row("Up since", `${fmtClock(e.since)} (${fmtAgo(e.since, now)})`));
    if (e.last_exit) {
      const when = e.last_exit_at ? ` at ${fmtClock(e.last_exit_at)}` : "";
      lines.push(...row("Last ended", `${e.last_exit}${when}`));
    }
    if (e.state === "up") lines.push(...row("Requests now", fmtCount(e.active)));
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
