// Reporting what the browser measured for one request to /api/chat/beacon.
//
// Times are performance.now() milliseconds since fetch was called. sendBeacon survives the tab
// closing but cannot set headers, so the CSRF token travels in the body; fetch with keepalive
// is the fallback where sendBeacon is missing or refuses.

export class RequestTimer {
  constructor(requestId) {
    this.requestId = requestId;
    this.start = performance.now();
    this.ttfb = null;
    this.ttft = null;
    this.done = null;
    this.tokens = 0;
    this.lastToken = null;
    this.gapTotal = 0;
    this.gapMax = 0;
    // Gaps under 2 ms: tokens that arrived together (the server counts its own the same way).
    this.burstGaps = 0;
    this.reported = false;
  }

  since() {
    return performance.now() - this.start;
  }

  firstByte() {
    if (this.ttfb === null) this.ttfb = this.since();
  }

  // Call right after a token has been put on the screen.
  tokenRendered() {
    const now = this.since();
    if (this.ttft === null) this.ttft = now;
    if (this.lastToken !== null) {
      const gap = now - this.lastToken;
      this.gapTotal += gap;
      this.gapMax = Math.max(this.gapMax, gap);
      if (gap < 2) this.burstGaps += 1;
    }
    this.lastToken = now;
    this.tokens += 1;
  }

  payload(outcome) {
    const round = (v) => (v === null ? null : Math.round(v * 1000) / 1000);
    const gaps = this.tokens - 1;
    return {
      request_id: this.requestId,
      outcome,
      ttfb_ms: round(this.ttfb),
      ttft_ms: round(this.ttft),
      done_ms: outcome === "ok" ? round(this.done ?? this.since()) : null,
      waited_ms: round(this.since()),
      tokens: this.tokens,
      itl_mean_ms: gaps > 0 ? round(this.gapTotal / gaps) : null,
      itl_max_ms: gaps > 0 ? round(this.gapMax) : null,
      span_ms: gaps > 0 ? round(this.lastToken - this.ttft) : null,
      burst_gaps: gaps > 0 ? this.burstGaps : null,
    };
  }

  // Report once: outcome is "ok", "error", "stopped", "timeout" or "abandoned".
  report(url, csrfToken, outcome) {
    if (this.reported) return;
    this.reported = true;
    if (outcome === "ok" && this.done === null) this.done = this.since();
    const body = JSON.stringify({ ...this.payload(outcome), csrf_token: csrfToken });
    let queued = false;
    try {
      queued = navigator.sendBeacon ? navigator.sendBeacon(url, body) : false;
    } catch {
      queued = false;
    }
    if (!queued) {
      fetch(url, {
        method: "POST",
        body,
        keepalive: true,
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
      }).catch(() => {});
    }
  }
}
