// Model output as markdown: sanitised, rendered while it streams, code highlighted, maths set.
//
// Model output is untrusted: markdown is rendered by a maintained parser, then sanitised down to
// what markdown itself produces. An answer a prompt injected must not draw controls of its own
// (a fake "log in again" form), restyle the page, load outside images (they tell their server
// who reads the answer) or open links that can reach back into this page.
//
// While an answer streams, only its last block is rendered again as tokens arrive: blocks before
// it (ended by a blank line outside a code fence) are rendered once and kept, so the cost of a
// token stays flat however long the answer grows. When the answer is done it is rendered once,
// whole, exactly as a stored answer is shown.
import { marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { t } from "./strings.js";

const MARKDOWN_TAGS = [
  "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre",
  "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
  // Maths, as TeX source: set by KaTeX after sanitising (setMaths).
  "tex-inline", "tex-block",
];
const MARKDOWN_ATTRS = ["href", "title", "start", "align"];
const LINK_SCHEMES = /^(?:https?:|mailto:)/i;
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (value) => String(value).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// $$…$$ and \[…\] on lines of their own are display maths; $…$ and \(…\) inline. A "$" followed
// by a space or a digit is money, not maths ("$5 and $10").
const MATHS = [
  {
    name: "texBlock",
    level: "block",
    start: (src) => src.match(/^ {0,3}(?:\$\$|\\\[)/m)?.index,
    tokenizer(src) {
      const match = /^(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n|$)/.exec(src);
      if (match) return { type: "texBlock", raw: match[0], tex: (match[1] ?? match[2]).trim() };
      return undefined;
    },
    renderer: (token) => `<tex-block>${escapeHtml(token.tex)}</tex-block>\n`,
  },
  {
    name: "texInline",
    level: "inline",
    start: (src) => src.match(/\$|\\\(/)?.index,
    tokenizer(src) {
      const match =
        /^(?:\$\$([^$\n]+?)\$\$|\$(?![\s\d$])((?:\\.|[^\\$\n])+?)(?<!\s)\$(?!\d)|\\\(((?:\\.|[^\n])+?)\\\))/.exec(src);
      if (match) return { type: "texInline", raw: match[0], tex: match[1] ?? match[2] ?? match[3] };
      return undefined;
    },
    renderer: (token) => `<tex-inline>${escapeHtml(token.tex)}</tex-inline>`,
  },
];

marked.use({
  extensions: MATHS,
  renderer: {
    // An image is shown as a link to it, never loaded.
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`;
    },
  },
});
// A fenced block's language ("language-python" on its <code>) is the one class kept: it picks the
// grammar to highlight with, and no style of the page matches it.
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName === "class" && node.tagName === "CODE" && /^language-[\w+#.-]{1,32}$/.test(data.attrValue)) {
    data.forceKeepAttr = true;
  }
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const SANITISE = {
  ALLOWED_TAGS: MARKDOWN_TAGS,
  ALLOWED_ATTR: MARKDOWN_ATTRS,
  ALLOWED_URI_REGEXP: LINK_SCHEMES,
  // The sanitised nodes themselves, not HTML to parse a second time.
  RETURN_DOM_FRAGMENT: true,
};

// `text` as sanitised markdown: a DocumentFragment to put in the page.
export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { async: false }), SANITISE);
}

// --- code: highlighted with highlight.js (each language loaded when first needed), copyable ----
const LANGUAGES = {
  bash: "bash", sh: "bash", zsh: "bash", shell: "shell", console: "shell",
  c: "c", h: "c", cpp: "cpp", "c++": "cpp", cc: "cpp", hpp: "cpp", cs: "csharp", csharp: "csharp",
  css: "css", go: "go", golang: "go", java: "java", javascript: "javascript", js: "javascript",
  mjs: "javascript", jsx: "javascript", json: "json", kotlin: "kotlin", kt: "kotlin",
  latex: "latex", tex: "latex", markdown: "markdown", md: "markdown", matlab: "matlab",
  php: "php", plaintext: "plaintext", text: "plaintext", txt: "plaintext", python: "python",
  py: "python", r: "r", ruby: "ruby", rb: "ruby", rust: "rust", rs: "rust", sql: "sql",
  swift: "swift", typescript: "typescript", ts: "typescript", tsx: "typescript", html: "xml",
  xml: "xml", svg: "xml", yaml: "yaml", yml: "yaml",
};
let hljs = null;
const loaded = new Map();

function highlighter(language) {
  if (!loaded.has(language)) {
    const core = hljs || import("../vendor/highlight/es/core.min.js").then((m) => (hljs = m.default));
    loaded.set(
      language,
      Promise.all([core, import(`../vendor/highlight/es/languages/${language}.min.js`)]).then(
        ([h, grammar]) => {
          h.registerLanguage(language, grammar.default);
          return h;
        },
      ),
    );
  }
  return loaded.get(language);
}

function highlight(code) {
  const named = [...code.classList].find((c) => c.startsWith("language-"));
  const language = named && LANGUAGES[named.slice(9).toLowerCase()];
  if (!language) return;
  highlighter(language)
    .then((h) => {
      // The block may have been rendered again meanwhile; highlight only one still shown.
      if (!code.isConnected || code.dataset.highlighted) return;
      const { value } = h.highlight(code.textContent, { language, ignoreIllegals: true });
      code.innerHTML = value; // highlight.js escapes the code; it adds only <span class="hljs-…">
      code.classList.add("hljs");
      code.dataset.highlighted = "1";
    })
    .catch(() => {}); // unhighlighted code is still code
}

// Copy `text`: the Clipboard API where the page may use it (HTTPS, localhost), else a selection.
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    const copied = document.execCommand("copy");
    area.remove();
    return copied;
  }
}

// A button that copies what `source()` returns and says so for a moment.
export function copyButton(label, source, className = "") {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `small secondary ${className}`.trim();
  button.textContent = label;
  button.addEventListener("click", async () => {
    const copied = await copyText(source());
    button.textContent = copied ? t("copied") : t("copyFailed");
    setTimeout(() => (button.textContent = label), 1500);
  });
  return button;
}

// --- maths: KaTeX, loaded when an answer first has some, as MathML (no inline styles) ---------
let katex = null;
// Formulas already set, by their TeX and mode: the block being written is rendered again with
// every token, its formulas are not set again.
const formulas = new Map();
const FORMULAS_KEPT = 500;

function formula(k, tex, display) {
  const key = `${display ? "D" : "I"}${tex}`;
  let markup = formulas.get(key);
  if (markup === undefined) {
    markup = k.renderToString(tex, {
      displayMode: display,
      output: "mathml",
      throwOnError: true,
      strict: "ignore", // Chinese text in maths is fine here
      maxSize: 50,
      maxExpand: 200,
    });
    if (formulas.size >= FORMULAS_KEPT) formulas.delete(formulas.keys().next().value);
    formulas.set(key, markup);
  }
  return markup;
}

function setMaths(root) {
  const found = root.querySelectorAll("tex-inline, tex-block");
  if (!found.length) return;
  (katex || (katex = import("../vendor/katex/katex.mjs").then((m) => m.default)))
    .then((k) => {
      for (const el of found) {
        if (!el.isConnected || el.dataset.set) continue;
        try {
          // KaTeX builds the markup from the TeX itself (no HTML passes through, \href and the
          // like are refused without `trust`), so it is not sanitised again.
          el.innerHTML = formula(k, el.textContent, el.tagName === "TEX-BLOCK");
          el.dataset.set = "1";
        } catch {
          el.classList.add("tex-error"); // shown as its TeX source
        }
      }
    })
    .catch(() => {});
}

// Highlight, set maths and add copy buttons to the code blocks of freshly rendered nodes.
function enhance(root, { live }) {
  for (const wide of root.querySelectorAll("pre, table")) wide.tabIndex = 0;
  for (const pre of root.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    if (!code) continue;
    // The block still being written is left plain: it is rendered again with every token.
    if (!live) highlight(code);
    const bar = document.createElement("div");
    bar.className = "code-bar";
    bar.append(copyButton(t("copyCode"), () => code.textContent, "copy-code"));
    pre.before(bar);
  }
  setMaths(root);
}

// Render `text` into `body`, whole (a stored answer, or one that is done).
export function showMarkdown(body, text) {
  body.replaceChildren(renderMarkdown(text));
  enhance(body, { live: false });
}

// An answer rendered as it streams: `append(text)` as tokens arrive, `finish()` when done.
export class LiveMarkdown {
  constructor(body) {
    this.body = body;
    this.text = "";
    this.kept = 0; // how much of `text` is rendered in blocks that will not change
    this.tail = document.createElement("div");
    this.tail.className = "md-tail";
    this.prose = null; // the tail's paragraph while it is prose (isProse)
    body.replaceChildren(this.tail);
  }

  append(text) {
    this.text += text;
    const end = blocksEnd(this.text, this.kept);
    if (end > this.kept) {
      const done = renderMarkdown(this.text.slice(this.kept, end));
      enhance(done, { live: false });
      this.tail.before(done);
      this.kept = end;
    }
    const tail = this.text.slice(this.kept);
    if (isProse(tail)) {
      // Nothing in it that markdown would change: the paragraph markdown would make, as text,
      // without parsing and sanitising it again for every token of a long paragraph.
      if (!this.prose || this.prose.parentNode !== this.tail) {
        this.prose = document.createElement("p");
        this.tail.replaceChildren(this.prose);
      }
      this.prose.textContent = tail.trimEnd();
      return;
    }
    this.prose = null;
    this.tail.replaceChildren(renderMarkdown(tail));
    enhance(this.tail, { live: true });
  }

  finish(text = this.text) {
    showMarkdown(this.body, text);
  }
}

// Prose: text that markdown renders as one plain paragraph of itself. No character markdown
// gives a meaning to (emphasis, code, links, HTML, entities, escapes, tables, maths, autolinked
// addresses), no line that opens a block (a heading, list, quote, fence, indented code, a setext
// underline), no hard line break, no blank line before more text.
const MARKED_CHARACTERS = /[\\`*_[\]<>!&~$|#=+{}@]|https?:|www\./i;
const BLOCK_LINE = /(?:^|\n)(?: {4}|\t| {0,3}(?:[-+*>]|\d{1,9}[.)]))/;
const HARD_BREAK_OR_BLANK = / {2,}\n|\\\n|\n[ \t]*\n[ \t]*\S/;

function isProse(text) {
  return (
    text.trim() !== "" &&
    !MARKED_CHARACTERS.test(text) &&
    !BLOCK_LINE.test(text) &&
    !HARD_BREAK_OR_BLANK.test(text)
  );
}

// A code fence: ``` with no other backtick on its line (```x``` is inline code), or ~~~.
const FENCE = /^ {0,3}(`{3,}(?=[^`]*$)|~{3,})/;
const LIST_ITEM = /^ {0,3}(?:[-*+]|\d{1,9}[.)])[ \t]/;

// Where the blocks of `text` after `from` that can no longer change end: at a blank line outside
// a code fence, once the next block has begun and does not continue the one before (an indented
// line, or another item of the same list, would). `from` is returned when there is none yet.
function blocksEnd(text, from) {
  let end = from;
  let fence = null; // the open code fence's marker
  let blank = false; // a blank line since the last line of the block
  let started = false; // a block has begun after `from`
  let inList = false; // that block is a list at its last unindented line
  for (let lineStart = from; ; ) {
    const newline = text.indexOf("\n", lineStart);
    if (newline === -1) break; // the last line may still grow
    const line = text.slice(lineStart, newline);
    const marker = FENCE.exec(line);
    if (fence) {
      const closes = marker && marker[1][0] === fence[0] && marker[1].length >= fence.length;
      if (closes && !line.slice(marker[0].length).trim()) fence = null;
    } else if (!line.trim()) {
      blank = true;
    } else {
      const indented = /^[ \t]/.test(line);
      if (!started || (blank && !indented && !(inList && LIST_ITEM.test(line)))) {
        if (started) end = lineStart;
        started = true;
      }
      // Whether the block is a list by now: its last line that is not indented says.
      if (!indented) inList = LIST_ITEM.test(line);
      blank = false;
      if (marker) fence = marker[1];
    }
    lineStart = newline + 1;
  }
  return end;
}
