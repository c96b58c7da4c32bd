// A page's strings in its language: the view puts them in the page as JSON
// (<script id="page-strings" type="application/json">), so the scripts need no catalogue request.

const element = document.getElementById("page-strings");
const STRINGS = element ? JSON.parse(element.textContent) : {};

// The string for `key`, its `{name}` placeholders filled from `values`.
export function t(key, values = {}) {
  const text = STRINGS[key] || key;
  return text.replace(/\{(\w+)\}/g, (match, name) => (name in values ? String(values[name]) : match));
}
