// The chat page's frame around the conversation: the conversations drawer on phones, the colour
// theme, the language switcher and the height of the visible viewport.
import { t } from "./strings.js";

const $ = (id) => document.getElementById(id);

// --- the drawer (below 768 px; the sidebar is always shown on wider screens) ---------------------
const drawer = $("drawer");
const menu = $("menu");
const narrow = window.matchMedia("(max-width: 767px)");

export function drawerOpen() {
  return document.body.classList.contains("drawer-open");
}

export function setDrawer(open) {
  const wasOpen = drawerOpen();
  document.body.classList.toggle("drawer-open", open);
  $("backdrop").hidden = !open;
  menu.setAttribute("aria-expanded", String(open));
  menu.setAttribute("aria-label", t(open ? "hideConversations" : "showConversations"));
  if (open) {
    const first = drawer.querySelector("button");
    if (first) first.focus();
  } else if (wasOpen && drawer.contains(document.activeElement)) {
    menu.focus();
  }
}

menu.addEventListener("click", () => setDrawer(!drawerOpen()));
$("backdrop").addEventListener("click", () => setDrawer(false));
narrow.addEventListener("change", () => setDrawer(false));

// --- theme: the system's unless the student picks one; the choice is remembered ----------------
const themeButton = $("theme");
const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
const isDark = () =>
  document.documentElement.dataset.theme
    ? document.documentElement.dataset.theme === "dark"
    : systemDark.matches;
const showTheme = () => themeButton.setAttribute("aria-pressed", String(isDark()));
themeButton.addEventListener("click", () => {
  const theme = isDark() ? "light" : "dark";
  document.documentElement.dataset.theme = theme;
  try {
    localStorage.setItem("chatsite-theme", theme);
  } catch {
    // Not remembered where storage is off; the page still switches.
  }
  showTheme();
});
systemDark.addEventListener("change", showTheme);
showTheme();

// --- language: Django's set_language remembers the choice in a cookie and reloads the page ------
const language = $("language-select");
language.addEventListener("change", () => language.form.requestSubmit());

// --- the visible viewport's height, for browsers whose on-screen keyboard overlays the page -----
// (dvh does not shrink for the keyboard there; visualViewport.height does).
if (window.visualViewport) {
  const fit = () => {
    document.body.style.setProperty("--viewport-height", `${Math.round(window.visualViewport.height)}px`);
  };
  window.visualViewport.addEventListener("resize", fit);
  fit();
}
