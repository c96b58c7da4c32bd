"""How an answer ends: its outcome, its last frame, its stream slot given back, what is stored
and what is measured (``AnswerEnd``, the half of ``services/answer.py``'s ``Answer`` that runs
once the frame loop is done).

The frame loop hands ``_last_frame`` why it stopped; ``_close`` then stops the engine and hands
what was said, with the answer's record and metrics, to the group writer, whatever ended it (a
cancelled task included); ``_finish`` lets the listeners see the end.
"""

import logging
from typing import TYPE_CHECKING

from assistant import conf, errors
from assistant.engines import EngineError, EngineTimeout
from assistant.models import StreamRecord
from assistant.services import background
from assistant.services.admission import chat_slot_release
from assistant.services.answer_ends import Ended
from assistant.services.answer_registry import answer_ended, answer_keep
from assistant.services.conversations import answer_rows, answer_store, question_rows
from assistant.services.persistence import rows_hand_over
from assistant.services.telemetry import AnswerSummary, stream_observe
from assistant.services.timings import now

if TYPE_CHECKING:
    from assistant.services.answer import Answer

#: One logger for an answer's lines, wherever in its code they are written.
logger = logging.getLogger("assistant.services.answer")

Outcome = StreamRecord.Outcome


class AnswerEnd:
    """The end of an ``Answer``: mixed into it, reading and setting the fields ``Answer``
    defines (each method's ``self`` is one)."""

    async def _last_frame(self: "Answer", ending: EngineError | Ended | None) -> bytes:
        """The outcome, the slot given back, and the last frame: ``done`` when the engine
        finished (``ending`` None), else the ``error`` for its failure or the early end."""
        timings = self.timings
        if ending is None:
            self._ended(Outcome.OK, "")
            await self._release_slot()
            return self.frames.done(
                finish_reason=self.finish_reason or "stop",
                tokens=timings.tokens,
                timings=timings.as_ms(),
                usage=(self.prompt_tokens, self.completion_tokens),
            )
        if isinstance(ending, Ended):
            end = ending.end
            self._ended(end.outcome, end.code)
            logger.info("Ended %s early (%s)", self.request_id, end.code or "stopped")
            await self._release_slot()
            # Kept for a resume; a dropped reader's connection is gone already.
            return self.frames.error(end.code, end.message) if end.message else b""
        timed_out = isinstance(ending, EngineTimeout)
        self._ended(Outcome.TIMEOUT if timed_out else Outcome.ENGINE_ERROR, ending.code)
        logger.warning("Engine failed on %s: %s", self.request_id, ending)
        if timed_out:
            failed = errors.ENGINE_TIMEOUT
        else:
            failed = errors.ENGINE_FAILED if timings.tokens else errors.ENGINE_UNAVAILABLE
        await self._release_slot()
        return self.frames.error(ending.code, failed.message)

    def _ended(self: "Answer", outcome: Outcome, code: str) -> None:
        self.outcome, self.error_code = outcome, code
        self.timings.finished = now()

    def _save_question(self: "Answer") -> None:
        """Hand the question to the group writer, once (it stores it before the answer, whose
        store is held until done)."""
        if not self._question_stored:
            self._question_stored = True
            rows = question_rows(
                owner_key=self.owner_key,
                classroom_id=self.identity.classroom_id,
                exchange=self.exchange,
                question=self.question,
            )
            rows_hand_over(rows)

    async def _release_slot(self: "Answer") -> None:
        """Give back the student's stream slot (once): before the last frame goes out, so a
        question asked the moment ``done`` arrives is not refused."""
        if not self._slot_released:
            self._slot_released = True
            await chat_slot_release(owner_key=self.owner_key, request_id=self.request_id)

    async def _close(self: "Answer") -> None:
        """Stop the engine and store what was said. Safe while being cancelled."""
        if self._closed:
            return
        self._closed = True
        # The live listener stays for the last frame (``_deliver_last``); its pings stop now.
        live, self._reader = self._live, None
        if live is not None:
            live.heartbeat.stop()
        try:
            await self.source.close()
        finally:
            self.seat.leave()
            self.timings.finished = self.timings.finished or now()
            summary = self._summary()
            # What was said goes to the writer first: nothing measured after can keep it back.
            self._save_question()
            rows = answer_rows(
                exchange=self.exchange,
                content="".join(self.text),
                outcome=self.outcome,
                finish_reason=self.error_code or self.finish_reason or self.outcome.value,
            )
            background.spawn(answer_store(rows, summary), name=f"answer:{self.request_id}")
            if not self._slot_released:
                background.spawn(self._release_slot(), name=f"release:{self.request_id}")
            stream_observe(summary)

    def _finish(self: "Answer") -> None:
        """Listeners see the end; a resumable answer stays so for ``RESUME_KEEP_S``, as its
        frames (``answer_registry.KeptAnswer``)."""
        self.buffer.finish()
        self._task = None
        answer_ended(self)
        if self.resumable:
            answer_keep(self, self.buffer.frames, conf.settings.CHATSITE_STREAM["RESUME_KEEP_S"])

    def _summary(self: "Answer") -> AnswerSummary:
        return AnswerSummary(
            request_id=self.request_id,
            owner_key=self.owner_key,
            classroom_id=self.identity.classroom_id,
            serving_path=self.serving_path,
            engine=self.engine.name,
            outcome=self.outcome,
            error_code=self.error_code,
            conversation_id=self.exchange.conversation_id,
            message_id=self.exchange.answer_message_id,
            timings=self.timings,
        )
