// Time-to-first-token histograms, one Chart.js bar chart per path, updated in place.
//
// Every chart shows the same range of bins (see binRange) so that the paths line up; a chart is
// built once per path and afterwards only its data changes.
import "../../vendor/chartjs/chart.umd.js";
import { t } from "../strings.js";
import { byId, el, setText } from "./dom.js";
import { ROLE_TEXT, fmtEdge, fmtMs } from "./format.js";

// The UMD build registers itself on the global object when loaded as a module.
const { Chart } = globalThis;

Chart.defaults.font.family = "system-ui, sans-serif";
Chart.defaults.font.size = 14;
Chart.defaults.color = "#1d2433";

const COLORS = { client: "#2f6fed", server: "#f79009" };

const container = byId("histograms");
const charts = new Map(); // path name -> {chart, caption, key, range}

// The round edges (1, 2, 5 × 10^n), to the value they stand for; null for the others.
function roundEdge(v) {
  if (!(v > 0)) return null;
  const pow = 10 ** Math.floor(Math.log10(v) + 1e-9);
  const m = [1, 2, 5, 10].find((x) => Math.abs(v / pow - x) / x < 0.03);
  return m === undefined ? null : m * pow;
}

// The bins worth showing: those with any request on any path, a little margin, twelve at least
// (the same range for every chart, so that the paths line up).
export function binRange(histogram) {
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

function buildChart(name) {
  const figure = el("figure", "histogram");
  figure.dataset.path = name;
  const caption = el("figcaption");
  const box = el("div", "chart-box");
  const canvas = el("canvas");
  canvas.id = `histogram-${name}`;
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", t("histogramLabel", { name }));
  box.append(canvas);
  figure.append(caption, box);
  container.append(figure);

  const entry = { chart: null, caption, key: "", range: { edges: [], start: 0, end: 0 } };
  // Bin i of the chart is bin start + i of the snapshot.
  const edgeIndex = (i) => entry.range.start + i;
  entry.chart = new Chart(canvas, {
    type: "bar",
    data: {
      labels: [],
      datasets: [
        { label: t("browser"), data: [], backgroundColor: COLORS.client },
        { label: t("server"), data: [], backgroundColor: COLORS.server },
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
          title: { display: true, text: t("histogramX") },
          ticks: {
            autoSkip: false,
            maxRotation: 0,
            callback: (value, index) => tickLabel(entry.range, edgeIndex(index)),
          },
        },
        y: {
          beginAtZero: true,
          title: { display: true, text: t("histogramY") },
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

// Draw one path's histogram over `range` (from binRange), building its chart the first time.
export function drawHistogram(name, stats, histogram, range) {
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
  chart.data.datasets[0].label = t("histogramBrowser", { n: sum(client) });
  chart.data.datasets[1].data = server.slice(start, end);
  chart.data.datasets[1].label = t("histogramServer", { n: sum(server) });
  chart.update("none");
  const role = stats.role ? ` (${ROLE_TEXT[stats.role] || stats.role})` : "";
  setText(entry.caption, `${name}${role}${stats.engine ? ` · ${stats.engine}` : ""}`);
}

// Remove every chart, for when the set of paths changes.
export function clearHistograms() {
  for (const { chart } of charts.values()) chart.destroy();
  charts.clear();
  container.replaceChildren();
}
