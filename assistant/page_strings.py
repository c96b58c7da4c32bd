"""What the chat page says from its scripts, in the request's language.

The page's scripts are ES modules with no catalogue of their own: the view hands them these
strings, translated, as JSON in the page (``json_script``), so a page costs no extra request.
Placeholders in braces are filled in by the script (``{n}``, ``{s}``).
"""

from django.conf import settings
from django.utils.functional import Promise
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from assistant.engines import EngineError, get_engine
from assistant.i18n import strings_translated
from assistant.services.serving_state import engine_alias_for

CHAT_STRINGS: dict[str, str | Promise] = {
    "answerCutShort": _("Answer cut short."),
    "noAnswer": _("No answer was produced."),
    "waitingFirstWord": _("Waiting for the first word…"),
    "youAreNext": _("You are next: the model is finishing another answer…"),
    "oneAhead": _("Waiting for the model: 1 question ahead of yours…"),
    "manyAhead": _("Waiting for the model: {n} questions ahead of yours…"),
    "serverAnswered": _("The server answered {status}."),
    "unreachable": _("The server could not be reached."),
    "reloadToGoOn": _("Reload the page to go on."),
    "reconnecting": _("Connection lost. Reconnecting…"),
    "stopped": _("Stopped."),
    "noFirstByte": _("The server did not answer within 5 seconds."),
    "stalled": _("The answer stalled."),
    "streamCut": _("The answer stopped early."),
    "somethingWrong": _("Something went wrong."),
    "untitled": _("Untitled"),
    "cannotOpen": _("That conversation could not be opened."),
    "retryingIn": _("{message} Asking again in {s} s…"),
    "seatWait": _("Waiting for a free seat ({waited} s so far). Asking again in {s} s…"),
    "answerReady": _("Answer ready."),
    "darkMode": _("Dark mode"),
    "showConversations": _("Show conversations"),
    "hideConversations": _("Hide conversations"),
    "copyCode": _("Copy code"),
    "copyAnswer": _("Copy"),
    "copied": _("Copied"),
    "copyFailed": _("Copy failed"),
    "regenerate": _("Ask again"),
    "edit": _("Edit"),
    "editQuestion": _("Edit your question"),
    "sendEdited": _("Send"),
    "cancel": _("Cancel"),
    "rename": _("Rename"),
    "renameNamed": _("Rename “{title}”"),
    "renameLabel": _("New name for “{title}”"),
    "delete": _("Delete"),
    "deleteNamed": _("Delete “{title}”"),
    "confirmDelete": _("Delete “{title}”? This cannot be undone."),
}


def chat_strings() -> dict[str, str]:
    """``CHAT_STRINGS`` in the active language."""
    return strings_translated(CHAT_STRINGS)


def model_language_notice(language: str) -> str:
    """What the page says when the model does not answer in the student's language; "" when
    it does (or when no engine is configured: the stream will say so itself)."""
    try:
        engine = get_engine(engine_alias_for(settings.CHATSITE_SERVING["BASELINE"]))
    except EngineError:
        return ""
    if engine.speaks(language):
        return ""
    if engine.speaks("en"):
        return gettext(
            "This model answers in English only. You can ask in your own language, but the "
            "answer will be in English."
        )
    return gettext("This model does not answer in your language.")
