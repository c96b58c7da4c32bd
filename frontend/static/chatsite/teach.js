// The teacher's pages: persona examples copied into the persona box with a click (the class
// page), and times shown and typed in the teacher's own time zone. Without this script the page still
// works: the examples are plain text to select, and times are in the site's zone.

const pad = (n) => String(n).padStart(2, "0");

/** A Date as <input type="datetime-local"> takes it, in the browser's zone. */
function localInput(date) {
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
    `T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

const persona = document.getElementById("id_persona");
for (const button of document.querySelectorAll("[data-persona-use]")) {
  const example = button.previousElementSibling;
  if (!persona || !example) continue;
  button.hidden = false;
  button.addEventListener("click", () => {
    persona.value = example.textContent.trim();
    persona.focus();
  });
}

const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
const zone = document.getElementById("id_zone");
if (zone && browserZone) {
  // The server reads the expiry in this zone; the stored one is shown in it.
  zone.value = browserZone;
  const expires = document.getElementById("id_code_expires_at");
  if (expires && expires.dataset.utc) expires.value = localInput(new Date(expires.dataset.utc));
}

// Every time on the teacher's pages, in the teacher's own zone and language.
const language = document.documentElement.lang || undefined;
for (const time of document.querySelectorAll("time[data-local]")) {
  time.textContent = new Date(time.dateTime).toLocaleString(language, {
    dateStyle: "medium",
    timeStyle: "short",
  });
}
