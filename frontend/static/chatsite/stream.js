// Reading a chat answer as Server-Sent Events over fetch + ReadableStream.
//
// EventSource cannot POST or send headers, so the page reads the stream itself: an incremental
// parser that follows the WHATWG "event stream interpretation" (events split across chunks,
// several events in one chunk, CRLF/CR/LF line ends, multi-line data joined with "\n", comments
// ignored but counted as liveness), and two watchdogs: no first byte within 5 s aborts, and
// after the first byte only silence longer than twice the server's ping interval does. A
// healthy long answer is never cut.

// https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
// Feed it decoded text with push(); it calls onEvent({event, data, id}) for each event, where
// `id` is the last event ID ("" until the stream sets one). `retry` holds the last valid retry
// field, also passed to onRetry. A block still open when the stream ends is never dispatched,
// as the spec discards it: there is nothing to flush.
export class SSEParser {
  constructor(onEvent, onRetry = () => {}) {
    this.onEvent = onEvent;
    this.onRetry = onRetry;
    this.retry = null;
    this.lastEventId = ""; // not reset by a dispatch: it holds until the stream sets another
    this.data = "";
    this.event = "";
    this.pending = ""; // the incomplete line the last chunk ended with
    this.started = false;
    this.afterCR = false;
  }

  push(text) {
    if (!text) return;
    // The spec's UTF-8 decode drops one BOM at the start of the stream (streamChat's decoder
    // keeps it, so that exactly one is dropped); a later one is part of a field name.
    if (!this.started && text[0] === "\uFEFF") text = text.slice(1);
    this.started = true;
    // A CR ending the last chunk was handled as a line end at once; a LF opening this one is
    // the rest of that CRLF, not a blank line.
    if (this.afterCR && text[0] === "\n") text = text.slice(1);
    this.afterCR = text.endsWith("\r");
    const lines = text.split(/\r\n|\r|\n/);
    lines[0] = this.pending + lines[0];
    this.pending = lines.pop();
    for (const line of lines) this.processLine(line);
  }

  processLine(line) {
    if (line === "") return this.dispatch();
    if (line[0] === ":") return; // a comment
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1); // one space only
    if (field === "data") this.data += value + "\n";
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^[0-9]+$/.test(value)) {
      this.retry = Number(value);
      this.onRetry(this.retry);
    }
    // Any other field is ignored.
  }

  dispatch() {
    const { data, event } = this;
    this.data = "";
    this.event = "";
    // A block without data lines (only an id, say) dispatches nothing.
    if (data === "") return;
    this.onEvent({ event: event || "message", data: data.slice(0, -1), id: this.lastEventId });
  }
}

// POST `body` as JSON to `url` and stream the answer. Returns {stop, finished}; `finished`
// resolves to {outcome, ...} where outcome is "done", "error", "stopped", "timeout" or "failed".
//
// When the connection breaks mid-answer (a network error, a stream cut without `done`, or
// silence past the idle watchdog) and `resumeUrl` is given, the answer is resumed: POST
// {request_id} to `resumeUrl` with `Last-Event-ID` set to the last token received, a few times
// with growing pauses. The server sends only the tokens after that one, so nothing is shown
// twice. A resume the server can no longer serve ends as an error carrying the saved `answer`.
//
// `stop()` ends the answer for good: with `stopUrl` it first POSTs {request_id} there, since a
// closed connection alone looks like a network drop and the server would go on generating for
// a resume. Then it aborts the fetch.
export function streamChat({
  url,
  body,
  csrfToken,
  requestId,
  resumeUrl = null,
  stopUrl = null,
  firstByteTimeoutMs = 5000,
  idleTimeoutMs = 30000,
  resumeDelaysMs = [300, 1000, 2000, 4000, 8000],
  onResponse = () => {},
  onFirstByte = () => {},
  onEvent = () => {},
  onReconnect = () => {},
}) {
  let controller = null;
  let abortReason = null;
  let timer = null;
  let lastId = 0;
  let streamId = null;
  let gotFirstByte = false;
  const arm = (ms, reason) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      abortReason = reason;
      controller.abort();
    }, ms);
  };
  const headers = {
    "Content-Type": "application/json",
    Accept: "text/event-stream",
    "X-CSRFToken": csrfToken,
  };
  const stop = () => {
    abortReason = "stopped";
    const id = streamId || requestId;
    if (stopUrl && id) {
      // keepalive: the request outlives this page if the student leaves right after.
      fetch(stopUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
        body: JSON.stringify({ request_id: id }),
        keepalive: true,
      }).catch(() => {});
    }
    if (controller) controller.abort();
  };

  // One request: its events go to onEvent, tokens already seen are dropped.
  const attempt = async (target, payload, extraHeaders) => {
    controller = new AbortController();
    abortReason = null;
    arm(firstByteTimeoutMs, "first_byte_timeout");
    let response;
    try {
      response = await fetch(target, {
        method: "POST",
        credentials: "same-origin",
        headers: { ...headers, ...extraHeaders },
        body: JSON.stringify(payload),
        signal: controller.signal,
      });
    } catch (err) {
      return ended(err);
    }
    onResponse(response);
    const type = response.headers.get("Content-Type") || "";
    if (!type.startsWith("text/event-stream")) {
      clearTimeout(timer);
      return plainResponse(response);
    }
    const reader = response.body.getReader();
    // ignoreBOM: the parser drops the stream's one leading BOM itself, as the spec does.
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    let result = { outcome: "failed", code: "stream_cut", message: "The answer stopped early." };
    const parser = new SSEParser((event) => {
      const data = safeJSON(event.data);
      if (event.event === "meta" && data) streamId = data.request_id;
      if (event.event === "token") {
        const id = Number(event.id);
        if (id <= lastId) return;
        lastId = id;
      }
      onEvent(event.event, data, event.id);
      if (event.event === "done") result = { outcome: "done", ...data };
      if (event.event === "error") result = { outcome: "error", ...data };
    });
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!gotFirstByte) {
          gotFirstByte = true;
          onFirstByte();
        }
        arm(idleTimeoutMs, "idle_timeout");
        parser.push(decoder.decode(value, { stream: true }));
      }
      parser.push(decoder.decode());
    } catch (err) {
      return ended(err);
    }
    clearTimeout(timer);
    return result;
  };

  const ended = (err) => {
    clearTimeout(timer);
    if (abortReason === "stopped") return { outcome: "stopped" };
    if (abortReason) return { outcome: "timeout", code: abortReason };
    return { outcome: "failed", code: "network", message: String(err && err.message ? err.message : err) };
  };

  // Broken after the answer began (not stopped, not a server's verdict): worth resuming.
  const broken = (result) =>
    streamId &&
    resumeUrl &&
    (result.outcome === "failed" ||
      (result.outcome === "timeout" && result.code === "idle_timeout"));

  const run = async () => {
    const extra = requestId ? { "X-Request-Id": requestId } : {};
    let result = await attempt(url, body, extra);
    for (const delay of resumeDelaysMs) {
      if (!broken(result)) break;
      onReconnect({ lastId, delayMs: delay });
      await new Promise((resolve) => setTimeout(resolve, delay));
      if (abortReason === "stopped") return { outcome: "stopped" };
      result = await attempt(resumeUrl, { request_id: streamId }, { "Last-Event-ID": String(lastId) });
    }
    return result;
  };

  return { stop, finished: run() };
}

async function plainResponse(response) {
  const payload = safeJSON(await response.text().catch(() => ""));
  if (!response.ok || (payload && payload.error)) {
    const error = (payload && payload.error) || {};
    return {
      outcome: "error",
      status: response.status,
      code: error.code || `http_${response.status}`,
      message: error.message || `The server answered ${response.status}.`,
      // A resume that came too late: what the server saved of the answer, if anything.
      answer: payload && payload.answer ? payload.answer : null,
      // How long the server asks us to wait (429, 503), for the page's countdown.
      retryAfter: retryAfterSeconds(response.headers.get("Retry-After")),
    };
  }
  const text = payload && (payload.text || payload.message);
  return { outcome: "done", text: typeof text === "string" ? text : "" };
}

// A Retry-After value in seconds from now: delay-seconds as given, an HTTP-date counted from
// `now` (0 once past); null when absent or neither. Every HTTP-date form has an hh:mm:ss time,
// which is required because Date.parse alone would also take "1.5" or "-5" as dates; the
// asctime form names no zone but means GMT, which Date.parse would not assume.
export function retryAfterSeconds(value, now = Date.now()) {
  const text = (value || "").trim();
  if (/^[0-9]+$/.test(text)) return Number(text);
  if (!/\d\d:\d\d:\d\d/.test(text)) return null;
  const date = Date.parse(text.endsWith("GMT") ? text : `${text} GMT`);
  return Number.isNaN(date) ? null : Math.max(0, Math.ceil((date - now) / 1000));
}

export function safeJSON(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// A request id the server accepts (it reuses ids of 8-64 characters from [A-Za-z0-9._-]), made
// in the page so that a request that never got an answer can still be reported. It is a version 7
// UUID (RFC 9562) in hex, as the server makes its own: the time in milliseconds (`now`), then 74
// random bits, so that the indexes on request ids take new ones at their end.
export function newRequestId(now = Date.now()) {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let millis = now;
  for (let i = 5; i >= 0; i -= 1) {
    bytes[i] = millis % 256;
    millis = Math.floor(millis / 256);
  }
  bytes[6] = (bytes[6] & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC's variant
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
