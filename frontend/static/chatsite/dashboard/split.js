// The traffic split: what share of new chats the candidate gets, and the form that changes it.
//
// Snapshots refresh the summary every second but never overwrite a form being edited; Apply
// POSTs JSON to the page's data-split-url with the CSRF token and shows the server's answer.
import { safeJSON } from "../stream.js";
import { t } from "../strings.js";
import { byId, setText } from "./dom.js";
import { BREAKER_TEXT, fmtClock, isNum } from "./format.js";

const els = {
  current: byId("split-current"),
  form: byId("split-form"),
  percent: byId("split-percent"),
  mode: byId("split-mode"),
  save: byId("split-save"),
  reset: byId("split-reset"),
  status: byId("split-status"),
};

// Where the share comes from (codes, as sent) in words.
const SOURCE_TEXT = { dashboard: t("sourceDashboard"), settings: t("sourceSettings") };

let dirty = false;
// What the latest snapshot said: the split and the names of the two paths.
let shown = { split: null, candidate: undefined, baseline: undefined };

// chat.js reads cookies the same way, but importing it would start the chat page here.
function cookie(name) {
  const match = document.cookie.match(new RegExp(`(?:^|; )${name}=([^;]*)`));
  return match ? decodeURIComponent(match[1]) : "";
}

// One sentence after another: a space after a Latin full stop, none after a Chinese one.
const andThen = (text, sentence) => (/[。！？]$/.test(text) ? text + sentence : `${text} ${sentence}`);

function splitSummary(split, candidate, baseline) {
  if (!split) return t("splitNone");
  const mode = split.mode || "auto";
  let text;
  if (mode === "force_candidate") text = t("splitAllCandidate", { candidate });
  else if (mode === "force_baseline") text = t("splitAllBaseline", { baseline });
  else text = t("splitShare", { percent: isNum(split.percent) ? split.percent : "–", candidate });
  const effective = split.effective_percent;
  if (mode === "auto" && isNum(effective) && effective !== split.percent) {
    const breaker = BREAKER_TEXT[split.breaker] || split.breaker;
    const key = breaker ? "splitInEffectBreaker" : "splitInEffect";
    text = andThen(text, t(key, { percent: effective, breaker }));
  }
  const who = split.updated_by;
  const time = split.updated_at ? fmtClock(split.updated_at) : "";
  if (who && time) text = andThen(text, t("splitChangedByAt", { who, time }));
  else if (who) text = andThen(text, t("splitChangedBy", { who }));
  else if (time) text = andThen(text, t("splitChangedAt", { time }));
  if (split.percent_source) {
    const source = SOURCE_TEXT[split.percent_source] || split.percent_source;
    text = andThen(text, t("splitShareFrom", { source }));
  }
  return text;
}

function fillForm(split) {
  if (!split) return;
  if (isNum(split.percent)) els.percent.value = String(split.percent);
  if (split.mode) els.mode.value = split.mode;
}

export function drawSplit(split, candidate, baseline) {
  shown = { split, candidate, baseline };
  els.current.dataset.mode = (split && split.mode) || "";
  setText(els.current, splitSummary(split, candidate, baseline));
  // Never overwrite what the teacher is typing or has chosen but not applied yet.
  const editing = [els.percent, els.mode].includes(document.activeElement);
  if (!dirty && !editing) fillForm(split);
}

function setStatus(text, kind = "") {
  els.status.textContent = text;
  els.status.className = kind;
}

function csrfToken() {
  const field = els.form.querySelector("input[name=csrfmiddlewaretoken]");
  return cookie("csrftoken") || (field ? field.value : "");
}

async function submit(event) {
  event.preventDefault();
  const percent = Number(els.percent.value);
  if (els.percent.value.trim() === "" || !(percent >= 0 && percent <= 100)) {
    setStatus(t("splitEnterShare"), "error");
    return;
  }
  const mode = els.mode.value;
  els.save.disabled = true;
  setStatus(t("splitSaving"));
  let response;
  let payload;
  try {
    response = await fetch(document.body.dataset.splitUrl, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      credentials: "same-origin",
      body: JSON.stringify({ percent, mode }),
    });
    payload = safeJSON(await response.text());
  } catch {
    setStatus(t("splitUnreachable"), "error");
    return;
  } finally {
    els.save.disabled = false;
  }
  if (!response.ok || !payload || !payload.split) {
    const error = (payload && payload.error) || {};
    setStatus(error.message || t("serverAnswered", { status: response.status }), "error");
    return;
  }
  dirty = false;
  fillForm(payload.split);
  setText(els.current, splitSummary(payload.split, shown.candidate, shown.baseline));
  setStatus(t("splitSavedAt", { time: fmtClock(new Date().toISOString()) }), "ok");
}

// Wire the form: Apply submits, Discard goes back to what the latest snapshot said.
export function setupSplitForm() {
  els.form.addEventListener("input", () => {
    dirty = true;
  });
  els.form.addEventListener("submit", submit);
  els.reset.addEventListener("click", () => {
    dirty = false;
    fillForm(shown.split);
    setStatus("");
  });
}
