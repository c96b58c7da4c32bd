// Small DOM helpers for the dashboard. Snapshot values only ever become text, never markup.
import { t } from "../strings.js";

export const byId = (id) => document.getElementById(id);

export function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

// The page string `key` as a list of text and nodes: each `{name}` placeholder becomes the node
// `nodes[name]` (say a figure updated in place), so the words around it follow the language.
export function textWith(key, nodes) {
  return t(key)
    .split(/\{(\w+)\}/)
    .map((part, i) => (i % 2 ? nodes[part] || `{${part}}` : part))
    .filter((part) => part !== "");
}

// Writing only on change keeps a once-a-second redraw from touching unchanged nodes.
export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}
