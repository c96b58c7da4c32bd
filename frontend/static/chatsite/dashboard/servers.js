// The HTTP servers the workers run under (Daphne, uvicorn), when nginx splits the students
// between a pool of each: each server's traffic and time to first token, and which of the two
// is faster.
import { t } from "../strings.js";
import { byId, el } from "./dom.js";
import { fmtCount, fmtMs, fmtRate, fmtRatio, isNum } from "./format.js";

const els = {
  card: byId("servers-card"),
  list: byId("servers"),
  compared: byId("servers-compared"),
};
let drawn = "";

function row(term, value) {
  return [el("dt", "", term), el("dd", "", value)];
}

const pair = (figures) => `${fmtMs(figures?.p50)} / ${fmtMs(figures?.p95)}`;

// The faster server by the browser's P95 (what students felt), else by the server's.
function faster(compared) {
  const ratio = isNum(compared.client_p95) ? compared.client_p95 : compared.server_p95;
  if (!isNum(ratio) || ratio === 1) return "";
  return ratio < 1 ? compared.candidate : compared.baseline;
}

function comparedLine(compared) {
  if (!compared) return t("serversOne");
  const text = t("serversCompared", {
    candidate: compared.candidate,
    baseline: compared.baseline,
    server: `${fmtRatio(compared.server_p50)} / ${fmtRatio(compared.server_p95)}`,
    browser: `${fmtRatio(compared.client_p50)} / ${fmtRatio(compared.client_p95)}`,
  });
  const name = faster(compared);
  return name ? `${text} ${t("serversFaster", { server: name })}` : text;
}

export function drawServers(servers, compared) {
  const entries = Object.entries(servers || {});
  els.card.hidden = entries.length === 0;
  const rows = entries.flatMap(([name, s]) => [
    ...row(
      name,
      t("serversTraffic", { requests: fmtCount(s.requests), errors: fmtRate(s.error_rate) }),
    ),
    ...row(t("serversServerTtft"), pair(s.server_ttft_ms)),
    ...row(t("serversBrowserTtft"), pair(s.client_ttft_ms)),
  ]);
  const line = entries.length ? comparedLine(compared) : "";
  const key = JSON.stringify([rows.map((node) => node.textContent), line]);
  if (key === drawn) return;
  drawn = key;
  els.list.replaceChildren(...rows);
  els.compared.textContent = line;
  els.compared.dataset.faster = compared ? faster(compared) : "";
}
