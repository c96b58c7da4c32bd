// The student's conversations in the sidebar (the drawer on a phone): open, rename, delete.
import { t } from "./strings.js";

export function cookie(name) {
  const match = document.cookie.match(new RegExp(`(?:^|; )${name}=([^;]*)`));
  return match ? decodeURIComponent(match[1]) : "";
}

export async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${response.status}`);
  return response.json();
}

// A change to a conversation (PATCH or DELETE, with the page's CSRF token): resolves to the
// response, or rejects with the server's message.
async function change(url, method, body) {
  const response = await fetch(url, {
    method,
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": cookie("csrftoken") },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.ok) return response;
  const payload = await response.json().catch(() => null);
  const error = (payload && payload.error) || {};
  throw new Error(error.message || t("serverAnswered", { status: response.status }));
}

function iconButton(symbol, className, label, title, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `icon small ${className}`;
  button.textContent = symbol;
  button.setAttribute("aria-label", label);
  button.title = title;
  button.addEventListener("click", onClick);
  return button;
}

// The list in `list`: `refresh(activeId)` reloads it. `onOpen(id)` opens a conversation,
// `onDeleted(id)` follows a deletion, `onError(message)` reports a failure, `locked()` says
// whether an answer is coming in (nothing is opened or deleted meanwhile).
export function conversationList({ list, url, onOpen, onDeleted, onError, locked }) {
  let active = null;

  const rename = (item, conversation, title) => {
    const input = document.createElement("input");
    input.type = "text";
    input.value = conversation.title || "";
    input.maxLength = 120;
    input.className = "rename";
    input.setAttribute("aria-label", t("renameLabel", { title }));
    let settled = false;
    const settle = async (save) => {
      if (settled) return;
      settled = true;
      const wanted = input.value.trim();
      if (save && wanted && wanted !== conversation.title) {
        try {
          await change(`${url}/${conversation.id}`, "PATCH", { title: wanted });
        } catch (err) {
          onError(err.message);
        }
      }
      await refresh(active);
      list.querySelector(`button.open[data-id="${conversation.id}"]`)?.focus();
    };
    input.addEventListener("keydown", (event) => {
      if (event.isComposing || event.keyCode === 229) return;
      if (event.key === "Enter") settle(true);
      else if (event.key === "Escape") {
        event.stopPropagation();
        settle(false);
      }
    });
    input.addEventListener("blur", () => settle(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  };

  const remove = async (conversation, title) => {
    if (locked() || !window.confirm(t("confirmDelete", { title }))) return;
    try {
      await change(`${url}/${conversation.id}`, "DELETE");
    } catch (err) {
      onError(err.message);
      return;
    }
    onDeleted(conversation.id);
    await refresh(active === conversation.id ? null : active);
  };

  const entry = (conversation) => {
    const title = conversation.title || t("untitled");
    const item = document.createElement("li");
    if (conversation.id === active) item.className = "active";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = title;
    open.dataset.id = conversation.id;
    if (conversation.id === active) open.setAttribute("aria-current", "true");
    open.addEventListener("click", () => onOpen(conversation.id));
    item.append(
      open,
      iconButton("✎", "rename-button", t("renameNamed", { title }), t("rename"), () =>
        rename(item, conversation, title),
      ),
      iconButton("✕", "delete-button", t("deleteNamed", { title }), t("delete"), () =>
        remove(conversation, title),
      ),
    );
    return item;
  };

  const refresh = async (activeId = active) => {
    active = activeId;
    try {
      const { conversations } = await getJSON(url);
      list.replaceChildren(...conversations.map(entry));
    } catch {
      // History is a convenience; the chat keeps working without it.
    }
  };

  return { refresh };
}
