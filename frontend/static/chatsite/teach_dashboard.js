// The teacher's live figures: asks /teach/api/figures every few seconds and updates the
// table's cells in place (textContent only: class names never become markup).
const table = document.getElementById("class-figures");
const status = document.getElementById("figures-status");

function pair(summary) {
  const show = (value) => (value === null || value === undefined ? "–" : String(value));
  return `${show(summary.p50)} / ${show(summary.p95)}`;
}

function update(payload) {
  for (const figures of payload.classes) {
    const row = table.querySelector(`tr[data-class="${CSS.escape(figures.id)}"]`);
    if (!row) continue;
    const cells = {
      active: String(figures.active),
      waiting: String(figures.waiting),
      questions: String(figures.questions),
      server: pair(figures.server_ttft_ms),
      client: pair(figures.client_ttft_ms),
      errors: String(figures.errors),
      abandoned: String(figures.abandoned),
    };
    for (const [name, text] of Object.entries(cells)) {
      const cell = row.querySelector(`[data-figure="${name}"]`);
      if (cell && cell.textContent !== text) cell.textContent = text;
    }
  }
  table.dataset.updated = payload.generated_at;
}

async function refresh() {
  try {
    const response = await fetch(table.dataset.url, {
      credentials: "same-origin",
      signal: AbortSignal.timeout(3 * every), // a request that hangs must not stop the updates
    });
    if (!response.ok) throw new Error(String(response.status));
    update(await response.json());
    status.textContent = "";
  } catch (error) {
    status.textContent = table.dataset.error;
  }
}

// One request at a time, the next a few seconds after the last answered; none while the tab is
// hidden, and one at once when it is shown again.
const every = Number(table?.dataset.refreshMs) || 3000;
let next = null;

function schedule() {
  clearTimeout(next);
  if (!document.hidden) next = setTimeout(() => refresh().finally(schedule), every);
}

if (table) {
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) clearTimeout(next);
    else refresh().finally(schedule);
  });
  schedule();
}
