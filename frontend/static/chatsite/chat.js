// The chat page: send a question, show the answer as it streams, keep the history; copy an
// answer or a code block, ask for an answer again, edit a question and send it again.
//
// Editing a question (or asking again) replaces it and everything after it: the old branch is
// kept on the server, set aside, and neither shown nor given to the model again.
import { RequestTimer } from "./beacon.js";
import { openEditor } from "./editor.js";
import { conversationList, cookie, getJSON } from "./history.js";
import { LiveMarkdown, copyButton, showMarkdown } from "./markdown.js";
import { following } from "./follow.js";
import { drawerOpen, setDrawer } from "./page.js";
import { newRequestId, streamChat } from "./stream.js";
import { t } from "./strings.js";


const config = document.body.dataset;
const $ = (id) => document.getElementById(id);
const els = {
  messages: $("messages"),
  form: $("ask"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  retry: $("retry"),
  status: $("status"),
  newChat: $("new-chat"),
  announcer: $("announcer"),
};

const view = following(els.messages);
let conversationId = null;
let current = null; // the stream in flight
let timer = null; // its measurements, reported when it ends (or the tab closes)
let lastAsk = null; // {question, replaces} of the last question sent, for Retry
let countdown = null; // a refused question waiting for its Retry-After: {timer}
let waitingSince = null; // when the question now waiting for a seat was first refused (ms)
// The bubbles an edited or repeated question replaces: hidden until the server has the new
// question (its `meta`), shown again if it never gets it.
let replacing = [];
// What each bubble says, as written (markdown for answers): what Copy and Edit use.
const texts = new WeakMap();

const history = conversationList({
  list: $("conversations"),
  url: config.historyUrl,
  onOpen: (id) => {
    setDrawer(false);
    openConversation(id);
  },
  onDeleted: (id) => {
    if (id === conversationId) startOver();
  },
  onError: (message) => setStatus(message, "error"),
  locked: () => Boolean(current || countdown),
});

function bubble(role, text = "", { status = "", id = "" } = {}) {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  el.dataset.role = role;
  if (id) el.dataset.id = id;
  const body = document.createElement("div");
  body.className = "body";
  if (role === "assistant" && text) showMarkdown(body, text);
  else body.textContent = text;
  texts.set(el, text);
  el.append(body);
  if (status && status !== "complete") markStatus(el, status);
  els.messages.append(el);
  view.resume();
  return el;
}

// The buttons under a bubble: Copy on answers, Edit on questions the server has stored, and
// Ask again on the last answer.
function addActions(el) {
  el.querySelector(".actions")?.remove();
  const bar = document.createElement("div");
  bar.className = "actions";
  if (el.dataset.role === "assistant") {
    if (texts.get(el)) bar.append(copyButton(t("copyAnswer"), () => texts.get(el)));
    const question = el.previousElementSibling;
    if (!el.nextElementSibling && question && question.dataset.id) {
      bar.append(action(t("regenerate"), () => again(question, texts.get(question))));
    }
  } else if (el.dataset.id) {
    bar.append(action(t("edit"), () => edit(el)));
  }
  if (bar.childElementCount) el.append(bar);
}

function action(label, run) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "small secondary";
  button.textContent = label;
  button.addEventListener("click", () => !current && !countdown && run());
  return button;
}

function refreshActions() {
  for (const el of els.messages.querySelectorAll(".message")) addActions(el);
}

// Send `question` again in place of `asked` (a question bubble) and everything after it.
function again(asked, question) {
  restoreReplaced();
  for (let next = asked; next; next = next.nextElementSibling) {
    next.hidden = true;
    replacing.push(next);
  }
  els.prompt.focus();
  ask(question, { replaces: asked.dataset.id });
}

// The server has the new question: what it replaces goes.
function dropReplaced() {
  for (const el of replacing) el.remove();
  replacing = [];
}

// The new question never reached the server: what it was to replace is the conversation still.
function restoreReplaced() {
  for (const el of replacing) el.hidden = false;
  replacing = [];
}

function edit(asked) {
  openEditor(asked, {
    text: texts.get(asked),
    maxLength: els.prompt.maxLength,
    onSend: (question) => !current && !countdown && again(asked, question),
    onClose: () => {
      addActions(asked);
      asked.querySelector(".actions button")?.focus();
    },
  });
}

function markStatus(el, status) {
  const note = document.createElement("p");
  note.className = "note";
  note.textContent = status === "partial" ? t("answerCutShort") : t("noAnswer");
  el.dataset.status = status;
  el.append(note);
}

function setStatus(text, kind = "") {
  els.status.textContent = text;
  els.status.className = kind;
}

function busy(on) {
  els.send.disabled = on;
  els.stop.hidden = !on;
  if (on) els.retry.hidden = true;
  els.messages.setAttribute("aria-busy", String(on));
}

// The session behind the page expired (or the server forgot it): get a new one, quietly.
// Resolves to null, or to the server's refusal ({message}) when it cannot issue one now.
async function renewSession() {
  try {
    const response = await fetch(config.sessionUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": cookie("csrftoken") },
    });
    if (response.ok) return null;
    const payload = await response.json().catch(() => null);
    return (payload && payload.error) || { message: t("serverAnswered", { status: response.status }) };
  } catch {
    return { message: t("unreachable") };
  }
}

// The class this page showed and what it said the teacher can read: the server refuses the
// question (409 class_changed) if either changed since, so nobody asks under words that no
// longer hold.
function classShown() {
  return { class: document.body.dataset.class || null, teachers_read: document.body.dataset.teachersRead === "true" };
}

async function ask(question, { renewed = false, replaces = null } = {}) {
  lastAsk = { question, replaces };
  const asked = bubble("user", question);
  const answer = bubble("assistant");
  answer.classList.add("streaming");
  answer.setAttribute("aria-busy", "true");
  const body = answer.querySelector(".body");
  const live = new LiveMarkdown(body);
  let text = "";
  let unshown = 0; // tokens received, not yet on the screen
  busy(true);
  els.announcer.textContent = "";
  setStatus(t("waitingFirstWord"));
  const requestId = newRequestId();
  answer.dataset.requestId = requestId;
  timer = new RequestTimer(requestId);
  const measured = timer;
  // The tokens of one network read are put on the screen together, right after it (a
  // microtask: no frame or timer is waited for), so the first token shows as soon as it comes.
  const show = () => {
    live.append(text.slice(live.text.length));
    for (; unshown > 0; unshown -= 1) measured.tokenRendered();
    view.follow();
  };
  const request = { message: question, conversation: conversationId, ...classShown() };
  if (replaces) request.replaces = replaces;
  current = streamChat({
    url: config.streamUrl,
    resumeUrl: config.resumeUrl,
    stopUrl: config.stopUrl,
    body: request,
    csrfToken: cookie("csrftoken"),
    requestId,
    onFirstByte: () => measured.firstByte(),
    onReconnect: () => setStatus(t("reconnecting")),
    firstByteTimeoutMs: Number(config.firstByteTimeoutMs || 5000),
    idleTimeoutMs: 2 * Number(config.pingIntervalMs || 15000),
    onEvent(event, data) {
      if (event === "meta" && data) {
        conversationId = data.conversation;
        answer.dataset.requestId = data.request_id;
        asked.dataset.id = data.user_message;
        answer.dataset.id = data.message;
        dropReplaced();
      } else if (event === "queue" && data && !text) {
        // The embedded model answers one student at a time: say where this question stands.
        const ahead = data.position - 1;
        setStatus(ahead <= 0 ? t("youAreNext") : ahead === 1 ? t("oneAhead") : t("manyAhead", { n: ahead }));
      } else if (event === "token" && data) {
        if (!text || els.status.textContent) setStatus("");
        text += data.text;
        if (unshown++ === 0) queueMicrotask(show);
      }
    },
  });
  const result = await current.finished;
  current = null;
  timer = null;
  if (result.code === "session_required" && !renewed) {
    // Ask again on a new session. The old session's conversations are not this one's.
    asked.remove();
    answer.remove();
    const refused = await renewSession();
    if (!refused) {
      conversationId = null;
      return ask(question, { renewed: true });
    }
    busy(false);
    waitingSince = null;
    bubble("user", question);
    setStatus(refused.message || t("reloadToGoOn"), "error");
    els.retry.hidden = false;
    return;
  }
  measured.report(config.beaconUrl, cookie("csrftoken"), CLIENT_OUTCOME[result.outcome] || "error");
  busy(false);
  answer.classList.remove("streaming");
  answer.removeAttribute("aria-busy");
  if (result.outcome === "done" && result.text !== undefined && !text) text = result.text;
  // Too late to resume: show what the server saved of the answer, if it has more.
  if (result.answer && typeof result.answer.content === "string") {
    if (result.answer.content.length > text.length) text = result.answer.content;
  }
  texts.set(answer, text);
  // Retry asks again as a new question once this one is stored, else in its place.
  lastAsk = { question, replaces: asked.dataset.id ? null : replaces };
  if (text) live.finish(text);
  else body.replaceChildren();
  view.follow();
  if (result.outcome === "done") {
    setStatus("");
    // Announced once, whole, when it is done (not token by token).
    const words = [...body.children].filter((el) => !el.classList.contains("code-bar"));
    els.announcer.textContent = `${t("answerReady")} ${words.map((el) => el.textContent).join(" ")}`;
  } else if (result.outcome === "stopped") {
    markStatus(answer, text ? "partial" : "failed");
    setStatus(t("stopped"));
  } else if (result.outcome === "timeout") {
    markStatus(answer, text ? "partial" : "failed");
    setStatus(result.code === "first_byte_timeout" ? t("noFirstByte") : t("stalled"), "error");
    els.retry.hidden = false;
  } else if (!text && result.retryAfter != null && RETRIED_STATUSES.has(result.status)) {
    // Refused for now (a full engine, a busy network): wait as the server asks, then ask again.
    asked.remove();
    answer.remove();
    if (waitingSince === null) waitingSince = Date.now();
    const message = result.message || t("somethingWrong");
    waitAndAsk(question, replaces, message, result.retryAfter, result.status);
    return;
  } else if (replacing.length) {
    // An edit or Ask again the server refused: the conversation stays as it was.
    asked.remove();
    answer.remove();
    restoreReplaced();
    setStatus(failureMessage(result), "error");
    els.retry.hidden = false;
  } else {
    markStatus(answer, text ? "partial" : "failed");
    setStatus(failureMessage(result), "error");
    els.retry.hidden = false;
  }
  waitingSince = null;
  refreshActions();
  history.refresh(conversationId);
}

// What the status line says of a failure: the server's own message (in the page's language),
// else the page's words for what the browser saw.
function failureMessage(result) {
  if (result.code === "stream_cut") return t("streamCut");
  if (result.code === "network") return t("unreachable");
  if (/^http_\d+$/.test(result.code || "")) return t("serverAnswered", { status: result.status });
  return result.message || t("somethingWrong");
}

// How the page reports each way a request can end.
const CLIENT_OUTCOME = { done: "ok", error: "error", stopped: "stopped", timeout: "timeout" };

// Refusals that pass: the page waits for the server's Retry-After, counting down, and asks again.
const RETRIED_STATUSES = new Set([429, 503]);
const MAX_WAIT_S = 120;

// A 503 (a full engine, a busy site) is a wait for a free seat: the line says how long the
// question has waited so far, whatever number of refusals that took.
function waitAndAsk(question, replaces, message, seconds, status) {
  let left = Math.min(Math.max(1, Math.ceil(seconds)), MAX_WAIT_S);
  lastAsk = { question, replaces };
  els.send.disabled = true;
  els.stop.hidden = false;
  const tick = () => {
    if (left <= 0) {
      countdown = null;
      ask(question, { replaces });
      return;
    }
    const waited = Math.round((Date.now() - waitingSince) / 1000);
    const line = status === 503 ? t("seatWait", { waited, s: left }) : t("retryingIn", { message, s: left });
    setStatus(line, "error");
    left -= 1;
    countdown.timer = setTimeout(tick, 1000);
  };
  countdown = { timer: null };
  tick();
}

function cancelCountdown() {
  if (!countdown) return false;
  clearTimeout(countdown.timer);
  countdown = null;
  waitingSince = null;
  restoreReplaced();
  busy(false);
  setStatus(t("stopped"));
  els.retry.hidden = false;
  return true;
}

// A tab closed mid-answer still reports what the student waited for.
window.addEventListener("pagehide", () => {
  if (timer) timer.report(config.beaconUrl, cookie("csrftoken"), "abandoned");
});

async function openConversation(id) {
  if (current || countdown) return;
  let messages;
  try {
    ({ messages } = await getJSON(`${config.historyUrl}/${id}`));
  } catch {
    setStatus(t("cannotOpen"), "error");
    return;
  }
  setStatus("");
  els.retry.hidden = true;
  conversationId = id;
  els.messages.replaceChildren();
  for (const m of messages) bubble(m.role, m.content, { status: m.status, id: m.id });
  refreshActions();
  history.refresh(conversationId);
}

function startOver() {
  conversationId = null;
  els.messages.replaceChildren();
  setStatus("");
  els.retry.hidden = true;
}

els.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const question = els.prompt.value.trim();
  if (!question || current || countdown) return;
  els.prompt.value = "";
  ask(question);
});
els.prompt.addEventListener("keydown", (event) => {
  // Enter also confirms an input-method composition (Japanese, Chinese…): that one must not send.
  // Safari reports it only through the legacy keyCode 229.
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
    event.preventDefault();
    els.form.requestSubmit();
  }
});
const stop = () => cancelCountdown() || (current && current.stop());
els.stop.addEventListener("click", stop);
// Esc closes the drawer when it is open, else stops the answer coming in.
document.addEventListener("keydown", (event) => {
  // Esc also ends an input-method composition (Safari says so only through keyCode 229).
  if (event.key !== "Escape" || event.isComposing || event.keyCode === 229) return;
  if (drawerOpen()) setDrawer(false);
  else if (current || countdown) {
    event.preventDefault();
    stop();
  }
});
els.retry.addEventListener("click", () => {
  if (!lastAsk || current || countdown) return;
  // Retrying an edit replaces the same question again.
  const replaced = lastAsk.replaces && els.messages.querySelector(`[data-id="${lastAsk.replaces}"]`);
  if (replaced) again(replaced, lastAsk.question);
  else ask(lastAsk.question, { replaces: lastAsk.replaces });
});
els.newChat.addEventListener("click", () => {
  if (current || countdown) return;
  setDrawer(false);
  startOver();
  els.prompt.focus();
  history.refresh(null);
});

history.refresh(null);
document.body.dataset.ready = "1";
