"""What the staff dashboard says from its scripts, in the request's language.

The same pattern as ``page_strings``: the dashboard's ES modules have no catalogue of their own,
so the view hands them these strings, translated, as JSON in the page (``json_script``), and the
modules read them with ``t(key, values)`` (``frontend/static/chatsite/strings.js``). Placeholders
in braces are filled in by the script. Codes and data values (path names, outcomes, breaker
states as sent) never change; only the words shown for them do.
"""

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from assistant.i18n import strings_translated

DASHBOARD_STRINGS: dict[str, str | Promise] = {
    # The live connection, top right.
    "liveConnecting": _("connecting…"),
    "liveLive": _("● live"),
    "liveStale": _("no update for a while…"),
    "liveReconnecting": _("reconnecting…"),
    "liveOffline": _("offline, retrying…"),
    "liveForbidden": _("staff access ended: log in again to see the figures"),
    "updatedAt": _("{window} · updated {time}"),
    # Numbers, units and times.
    "percent": _("{n} %"),
    "seconds": _("{n} s"),
    "points": _("{n} pts"),
    "secondsAgo": _("{n} s ago"),
    "minutesAgo": _("{n} min ago"),
    "hoursAgo": _("{n} h ago"),
    "sinceAgo": _("since {time} ({ago})"),
    "timeAgo": _("{time} ({ago})"),
    # The circuit breaker's states and its log.
    "breakerClosed": _("closed"),
    "breakerOpen": _("open"),
    "breakerHalfOpen": _("half open"),
    "cfgWindow": _("Window"),
    "cfgMinSamples": _("Minimum samples"),
    "cfgTripsAbove": _("Trips above"),
    "cfgTripsAboveValue": _("×{ratio} baseline P95"),
    "cfgErrorMargin": _("Error margin"),
    "cfgCooldown": _("Cooldown"),
    "cfgHalfOpenShare": _("Share while half open"),
    "noEvents": _("Nothing has happened yet."),
    "eventTripped": _("tripped"),
    "eventHalfOpen": _("half open"),
    "eventClosed": _("closed"),
    "eventReopened": _("reopened"),
    "eventSplitChanged": _("split changed"),
    "eventFallback": _("event"),
    "eventToBreaker": _("→ breaker {state}"),
    "eventBy": _("by {actor}"),
    # The path cards and the ratio badge.
    "roleBaseline": _("baseline"),
    "roleCandidate": _("candidate"),
    "roleApi": _("API, by key"),
    "engineName": _("engine: {engine}"),
    "kpiRequests": _("Requests"),
    "kpiErrors": _("Errors"),
    "kpiFailed": _("{n} failed"),
    "kpiAbandoned": _("Abandoned"),
    "kpiLeftEarly": _("{n} left early"),
    "kpiBursts": _("Tokens arrived in bursts"),
    "kpiChecked": _("of {n} checked"),
    "colTtft": _("TTFT"),
    "colCount": _("n"),
    "percentilesBinned": _(
        "Percentiles from per-minute and per-hour sums: within 2 % (or 0.1 ms) of the exact ones."
    ),
    "server": _("server"),
    "browser": _("browser"),
    "ratioTitle": _(
        "Candidate ({candidate}) against baseline ({baseline}); warning above ×{p95} server "
        "P95 or {points} error rate."
    ),
    "ratioHeading": _("{candidate} vs {baseline}:"),
    "ratioServerP95": _("server P95"),
    "ratioBrowserP95": _("browser P95"),
    "ratioErrors": _("errors"),
    # The model process card.
    "engineAnswering": _("answering"),
    "engineLoading": _("loading"),
    "engineRestarting": _("restarting"),
    "engineState": _("{alias}: state"),
    "engineRestarts": _("Restarts"),
    "engineUpSince": _("Up since"),
    "engineLastEnded": _("Last ended"),
    "engineEndedAt": _("{exit} at {time}"),
    "engineRequestsNow": _("Requests now"),
    # The HTTP servers card.
    "serversTraffic": _("{requests} requests, {errors} errors"),
    "serversServerTtft": _("Server TTFT P50 / P95"),
    "serversBrowserTtft": _("Browser TTFT P50 / P95"),
    "serversCompared": _("{candidate} vs {baseline}: server {server}, browser {browser}."),
    "serversFaster": _("Faster for students: {server}."),
    "serversOne": _("Only one server answered in this window: nothing to compare."),
    # The traffic split.
    "splitNone": _("No split reported."),
    "splitAllCandidate": _("Every new chat goes to the candidate ({candidate})."),
    "splitAllBaseline": _("Every new chat goes to the baseline ({baseline})."),
    # "% o" is not a %-format here: the script fills in the braces.
    # xgettext:no-python-format
    "splitShare": _("{percent} % of new chats go to {candidate}."),
    "splitInEffect": _("In effect now: {percent} %."),
    "splitInEffectBreaker": _("In effect now: {percent} % (breaker {breaker})."),
    "splitChangedByAt": _("Changed by {who} at {time}."),
    "splitChangedBy": _("Changed by {who}."),
    "splitChangedAt": _("Changed at {time}."),
    "splitShareFrom": _("Share from: {source}."),
    "sourceDashboard": pgettext_lazy("where the candidate's share is set", "dashboard"),
    "sourceSettings": pgettext_lazy("where the candidate's share is set", "settings"),
    "splitEnterShare": _("Enter a share between 0 and 100."),
    "splitSaving": _("Saving…"),
    "splitUnreachable": _("Could not reach the server. Nothing was changed."),
    "serverAnswered": _("The server answered {status}."),
    "splitSavedAt": _("Saved at {time}."),
    # The histograms.
    "histogramLabel": _("Time to first token histogram, {name}"),
    "histogramX": _("time to first token (bin start)"),
    "histogramY": _("requests"),
    "histogramBrowser": _("browser ({n})"),
    "histogramServer": _("server ({n})"),
    # The slowest requests.
    "stageParse": _("received → parsed"),
    "stageSubmit": _("parsed → engine submit"),
    "stageEngine": _("engine submit → first token"),
    "stageSend": _("first token → sent"),
    "stageStream": _("sent → finished"),
    "stageTtfb": _("fetch → first byte"),
    "stageTtft": _("first byte → first token shown"),
    "stageDone": _("first token → done"),
    "stageWaited": _("waited, no token"),
    "stageTitle": _("{label}: {duration} (at {end})"),
    "outcomeOk": _("ok"),
    "outcomeClientAbort": _("left early"),
    "outcomeEngineError": _("engine error"),
    "outcomeTimeout": _("timed out"),
    "outcomeServerError": _("server error"),
    "outcomeSlowClient": _("slow client"),
    "outcomeGivenUp": _("given up"),
    "outcomeError": _("error"),
    "outcomeStopped": _("stopped"),
    "outcomeAbandoned": _("abandoned"),
    "browserOutcome": _("browser: {outcome}"),
    "tokens": _("{n} tokens"),
    "tokensInBursts": _("tokens in bursts"),
    "trackSummary": _("first token {ttft} · end {end}"),
    "noTokenWaited": _("no token · waited {waited}"),
    "browserDidNotReport": _("the browser did not report"),
    "noRequests": _("No requests in this window yet."),
}


def dashboard_strings() -> dict[str, str]:
    """``DASHBOARD_STRINGS`` in the active language."""
    return strings_translated(DASHBOARD_STRINGS)
