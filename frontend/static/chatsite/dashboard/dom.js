// Small DOM helpers for the dashboard. Snapshot values only ever become text, never markup.

export const byId = (id) => document.getElementById(id);

export function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

// Writing only on change keeps a once-a-second redraw from touching unchanged nodes.
export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}
