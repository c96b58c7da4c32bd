// The colour theme the student chose ("light" or "dark"), applied before the page is drawn so
// that it does not flash; with no choice the page follows prefers-color-scheme (chat.css).
// A classic script, loaded before the stylesheet: the page allows no inline script.
try {
  const chosen = localStorage.getItem("chatsite-theme");
  if (chosen === "light" || chosen === "dark") document.documentElement.dataset.theme = chosen;
} catch {
  // Storage can be off (private mode, policy): the system's theme applies.
}
