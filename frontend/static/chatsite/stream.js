// Reading a chat answer as Server-Sent Events over fetch + ReadableStream.
//
// EventSource cannot POST or send headers, so the page reads the stream itself: an incremental
// parser that follows the WHATWG grammar (events split across chunks, several events in one
// chunk, CRLF/CR/LF line ends, multi-line data joined with "\n", comments ignored but counted as
// liveness), and two watchdogs: no first byte within 5 s aborts, and after the first byte only
// silence longer than twice the server's ping interval does. A healthy long answer is never cut.

export class SSEParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.data = [];
    this.event = "";
    this.id = null;
  }

  // Feed decoded text; calls onEvent({event, data, id}) for each complete event.
  push(text) {
    this.buffer += text;
    let start = 0;
    for (;;) {
      const lf = this.buffer.indexOf("\n", start);
      const cr = this.buffer.indexOf("\r", start);
      let end = -1;
      let next = -1;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        // A CR at the very end may be the first half of a CRLF still in flight.
        if (cr === this.buffer.length - 1) break;
        end = cr;
        next = this.buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else if (lf !== -1) {
        end = lf;
        next = lf + 1;
      } else {
        break;
      }
      this.line(this.buffer.slice(start, end));
      start = next;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) {
        this.onEvent({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
      }
      this.reset();
      return;
    }
    if (line[0] === ":") return;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
  }
}

// POST `body` as JSON to `url` and stream the answer. Returns {stop, finished}; `finished`
// resolves to {outcome, ...} where outcome is "done", "error", "stopped", "timeout" or "failed".
export function streamChat({
  url,
  body,
  csrfToken,
  requestId,
  firstByteTimeoutMs = 5000,
  idleTimeoutMs = 30000,
  onResponse = () => {},
  onFirstByte = () => {},
  onEvent = () => {},
}) {
  const controller = new AbortController();
  let abortReason = null;
  let timer = null;
  const arm = (ms, reason) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      abortReason = reason;
      controller.abort();
    }, ms);
  };
  const stop = () => {
    if (!abortReason) abortReason = "stopped";
    controller.abort();
  };

  const run = async () => {
    arm(firstByteTimeoutMs, "first_byte_timeout");
    let response;
    try {
      response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          Accept: "text/event-stream",
          "X-CSRFToken": csrfToken,
          ...(requestId ? { "X-Request-Id": requestId } : {}),
        },
        body: JSON.stringify(body),
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
    const decoder = new TextDecoder("utf-8");
    let result = { outcome: "failed", code: "stream_cut", message: "The answer stopped early." };
    const parser = new SSEParser((event) => {
      const payload = safeJSON(event.data);
      onEvent(event.event, payload, event.id);
      if (event.event === "done") result = { outcome: "done", ...payload };
      if (event.event === "error") result = { outcome: "error", ...payload };
    });
    let first = true;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (first) {
          first = false;
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
    };
  }
  const text = payload && (payload.text || payload.answer || payload.message);
  return { outcome: "done", text: typeof text === "string" ? text : "" };
}

export function safeJSON(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// A request id the server accepts (it reuses ids of 8-64 characters from [A-Za-z0-9._-]), made
// in the page so that a request that never got an answer can still be reported.
export function newRequestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
