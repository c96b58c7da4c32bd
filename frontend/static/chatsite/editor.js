// Editing a question in place: its bubble turns into a box with Send and Cancel.
import { t } from "./strings.js";

// Open the editor in `bubble` (a question) on `text`. `onSend(text)` gets the edited question
// (Enter in the box adds a line; Send sends); `onClose()` runs when it is cancelled (Cancel or
// Esc), after the bubble shows its question again.
export function openEditor(bubble, { text, maxLength, onSend, onClose }) {
  const editor = document.createElement("form");
  editor.className = "editor";
  const area = document.createElement("textarea");
  area.value = text;
  area.rows = Math.min(8, text.split("\n").length + 1);
  area.maxLength = maxLength;
  area.setAttribute("aria-label", t("editQuestion"));
  const send = document.createElement("button");
  send.type = "submit";
  send.textContent = t("sendEdited");
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "secondary";
  cancel.textContent = t("cancel");
  const body = bubble.querySelector(".body");
  const close = () => {
    editor.remove();
    body.hidden = false;
    onClose();
  };
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !event.isComposing && event.keyCode !== 229) {
      event.stopPropagation();
      close();
    }
  });
  editor.addEventListener("submit", (event) => {
    event.preventDefault();
    const question = area.value.trim();
    if (question) onSend(question);
  });
  editor.append(area, send, cancel);
  body.hidden = true;
  bubble.querySelector(".actions")?.remove();
  bubble.append(editor);
  area.focus();
}
