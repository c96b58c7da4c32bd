// The chat page: send a question, show the answer token by token, keep the history.
import { marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { RequestTimer } from "./beacon.js";
import { newRequestId, streamChat } from "./stream.js";

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
  conversations: $("conversations"),
  newChat: $("new-chat"),
};

let conversationId = null;
let current = null; // the stream in flight
let timer = null; // its measurements, reported when it ends (or the tab closes)
let lastQuestion = null;

// Model output is untrusted: markdown is rendered by a maintained parser, then sanitised down to
// what markdown itself produces. An answer a prompt injected must not draw controls of its own
// (a fake "log in again" form), restyle the page, load outside images (they tell their server
// who reads the answer) or open links that can reach back into this page.
const MARKDOWN_TAGS = [
  "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre",
  "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
];
const MARKDOWN_ATTRS = ["href", "title", "start", "align"];
const LINK_SCHEMES = /^(?:https?:|mailto:)/i;
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (value) => String(value).replace(/[&<>"']/g, (c) => ESCAPES[c]);

marked.use({
  renderer: {
    // An image is shown as a link to it, never loaded.
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`;
    },
  },
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { async: false }), {
    ALLOWED_TAGS: MARKDOWN_TAGS,
    ALLOWED_ATTR: MARKDOWN_ATTRS,
    ALLOWED_URI_REGEXP: LINK_SCHEMES,
  });
}

function cookie(name) {
  const match = document.cookie.match(new RegExp(`(?:^|; )${name}=([^;]*)`));
  return match ? decodeURIComponent(match[1]) : "";
}

function bubble(role, text = "", status = "") {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  el.dataset.role = role;
  const body = document.createElement("div");
  body.className = "body";
  if (role === "assistant" && text) body.innerHTML = renderMarkdown(text);
  else body.textContent = text;
  el.append(body);
  if (status && status !== "complete") markStatus(el, status);
  els.messages.append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function markStatus(el, status) {
  const note = document.createElement("p");
  note.className = "note";
  note.textContent = status === "partial" ? "Answer cut short." : "No answer was produced.";
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
    return (payload && payload.error) || { message: `The server answered ${response.status}.` };
  } catch {
    return { message: "The server could not be reached." };
  }
}

async function ask(question, renewed = false) {
  lastQuestion = question;
  const asked = bubble("user", question);
  const answer = bubble("assistant");
  answer.classList.add("streaming");
  const body = answer.querySelector(".body");
  let text = "";
  busy(true);
  setStatus("Waiting for the first word…");
  const requestId = newRequestId();
  answer.dataset.requestId = requestId;
  timer = new RequestTimer(requestId);
  const measured = timer;
  current = streamChat({
    url: config.streamUrl,
    resumeUrl: config.resumeUrl,
    stopUrl: config.stopUrl,
    body: { message: question, conversation: conversationId },
    csrfToken: cookie("csrftoken"),
    requestId,
    onFirstByte: () => measured.firstByte(),
    onReconnect: () => setStatus("Connection lost. Reconnecting…"),
    firstByteTimeoutMs: Number(config.firstByteTimeoutMs || 5000),
    idleTimeoutMs: 2 * Number(config.pingIntervalMs || 15000),
    onEvent(event, data) {
      if (event === "meta" && data) {
        conversationId = data.conversation;
        answer.dataset.requestId = data.request_id;
      } else if (event === "queue" && data && !text) {
        // The embedded model answers one student at a time: say where this question stands.
        setStatus(
          data.position === 1
            ? "You are next: the model is finishing another answer…"
            : `Waiting for the model: ${data.position - 1} questions ahead of yours…`,
        );
      } else if (event === "token" && data) {
        if (!text || els.status.textContent) setStatus("");
        text += data.text;
        // Plain text while streaming: cheap, and safe whatever the model sends.
        body.textContent = text;
        measured.tokenRendered();
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
      return ask(question, true);
    }
    busy(false);
    bubble("user", question);
    setStatus(refused.message || "Reload the page to go on.", "error");
    els.retry.hidden = false;
    return;
  }
  measured.report(config.beaconUrl, cookie("csrftoken"), CLIENT_OUTCOME[result.outcome] || "error");
  busy(false);
  answer.classList.remove("streaming");
  if (result.outcome === "done" && result.text !== undefined && !text) text = result.text;
  // Too late to resume: show what the server saved of the answer, if it has more.
  if (result.answer && typeof result.answer.content === "string") {
    if (result.answer.content.length > text.length) text = result.answer.content;
  }
  if (text) body.innerHTML = renderMarkdown(text);
  if (result.outcome === "done") {
    setStatus("");
  } else if (result.outcome === "stopped") {
    markStatus(answer, text ? "partial" : "failed");
    setStatus("Stopped.");
  } else if (result.outcome === "timeout") {
    markStatus(answer, text ? "partial" : "failed");
    setStatus(
      result.code === "first_byte_timeout"
        ? "The server did not answer within 5 seconds."
        : "The answer stalled.",
      "error",
    );
    els.retry.hidden = false;
  } else {
    markStatus(answer, text ? "partial" : "failed");
    setStatus(result.message || "Something went wrong.", "error");
    els.retry.hidden = false;
  }
  refreshHistory();
}

// How the page reports each way a request can end.
const CLIENT_OUTCOME = { done: "ok", error: "error", stopped: "stopped", timeout: "timeout" };

// A tab closed mid-answer still reports what the student waited for.
window.addEventListener("pagehide", () => {
  if (timer) timer.report(config.beaconUrl, cookie("csrftoken"), "abandoned");
});

async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${response.status}`);
  return response.json();
}

async function refreshHistory() {
  try {
    const { conversations } = await getJSON(config.historyUrl);
    els.conversations.replaceChildren(
      ...conversations.map((c) => {
        const li = document.createElement("li");
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = c.title || "Untitled";
        button.dataset.id = c.id;
        if (c.id === conversationId) li.className = "active";
        button.addEventListener("click", () => openConversation(c.id));
        li.append(button);
        return li;
      }),
    );
  } catch {
    // History is a convenience; the chat keeps working without it.
  }
}

async function openConversation(id) {
  if (current) return;
  let messages;
  try {
    ({ messages } = await getJSON(`${config.historyUrl}/${id}`));
  } catch {
    setStatus("That conversation could not be opened.", "error");
    return;
  }
  setStatus("");
  els.retry.hidden = true;
  conversationId = id;
  els.messages.replaceChildren();
  for (const m of messages) bubble(m.role, m.content, m.status);
  refreshHistory();
}

els.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const question = els.prompt.value.trim();
  if (!question || current) return;
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
els.stop.addEventListener("click", () => current && current.stop());
els.retry.addEventListener("click", () => lastQuestion && !current && ask(lastQuestion));
els.newChat.addEventListener("click", () => {
  if (current) return;
  conversationId = null;
  els.messages.replaceChildren();
  setStatus("");
  els.retry.hidden = true;
  refreshHistory();
});

refreshHistory();
document.body.dataset.ready = "1";
