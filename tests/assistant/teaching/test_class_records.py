"""What a teacher sees of their classes, live and exported: the counts a worker publishes of
its class answers, and a real Daphne worker's while a student waits for an answer; the CSV row by
row, with the question and answer only where the class lets its teachers read them, and never a
formula; the recent questions page."""

import asyncio
import csv
import io
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from assistant.models import ClassMember, Classroom, StreamRecord
from assistant.services import class_live
from assistant.services.class_export import class_csv_page
from assistant.services.class_figures import student_pseudonym
from assistant.services.identity import Identity
from tests.assistant.teaching.teaching_support import (
    World,
    body_of,
    figures_by_id,
    summary,
)
from tests.support import ChatClient, Event, LiveServer, wait_for

DAPHNE = pytest.mark.django_db(transaction=True)
CSV_HEADER = (
    "time,student,request_id,serving_path,engine,outcome,error_code,tokens,"
    "server_ttft_ms,browser_ttft_ms,inter_token_mean_ms,total_ms"
)


# What a worker publishes of its class answers.


@dataclass
class RunningAnswer:
    """What ``class_live.live_counts`` reads of a running answer (``services.answer.Answer``)."""

    owner_key: str
    classroom_id: uuid.UUID | None
    first_token_sent: float = 0.0
    finished: bool = False
    identity: Identity = field(init=False)
    timings: SimpleNamespace = field(init=False)

    def __post_init__(self) -> None:
        classroom = None if self.classroom_id is None else SimpleNamespace(id=self.classroom_id)
        self.identity = Identity(owner_key=self.owner_key, classroom=classroom)  # type: ignore[arg-type]
        self.timings = SimpleNamespace(first_token_sent=self.first_token_sent)


def test_live_counts_are_per_class_and_leave_out_ended_and_classless_answers() -> None:
    physics, chemistry = uuid.uuid4(), uuid.uuid4()
    answers = [
        RunningAnswer("s2", physics),
        RunningAnswer("s1", physics, first_token_sent=12.5),
        RunningAnswer("s2", physics, first_token_sent=3.0),
        RunningAnswer("s3", physics, finished=True),
        RunningAnswer("s4", chemistry),
        RunningAnswer("s5", None),
    ]
    assert class_live.live_counts(answers) == {
        str(physics): {"streaming": 3, "waiting": 1, "students": ["s1", "s2"]},
        str(chemistry): {"streaming": 1, "waiting": 1, "students": ["s4"]},
    }
    assert class_live.live_counts([RunningAnswer("s5", None)]) == {}


async def test_an_answer_started_while_the_idle_state_is_written_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A class answer that starts while the worker is writing that it is idle (the write is on
    the database's writer thread, so it can take a while under load) is still published: the
    answer's ``class_live_start`` finds the loop running, so the loop must not end on counts
    read before that write. Here the write is held open by the test and records what it was
    given instead of storing it (the interleaving cannot be timed against a real worker)."""
    running: list[RunningAnswer] = []
    written: list[class_live.Counts] = []
    writing, release = asyncio.Event(), asyncio.Event()

    async def write(func: Any, worker: str, counts: class_live.Counts) -> None:
        written.append(counts)
        if counts == {} and not release.is_set():
            writing.set()
            await release.wait()

    monkeypatch.setattr(class_live, "answers_running", lambda: list(running))
    monkeypatch.setattr(class_live, "run_db_write", write)
    monkeypatch.setattr(class_live, "PUBLISH_S", 0.01)
    monkeypatch.setattr(class_live._publisher, "task", None)
    classroom = uuid.uuid4()
    class_live.class_live_start()
    task = class_live._publisher.task
    assert task is not None
    try:
        await asyncio.wait_for(writing.wait(), 5)  # the loop writes that it is idle
        running.append(RunningAnswer("s1", classroom))
        class_live.class_live_start()  # as answer_start does for a class answer
        release.set()
        for _ in range(200):  # 2 s: two hundred publishing periods
            if any(str(classroom) in counts for counts in written):
                break
            await asyncio.sleep(0.01)
        assert written[-1] == {str(classroom): {"streaming": 1, "waiting": 1, "students": ["s1"]}}
    finally:
        for started in {task, class_live._publisher.task}:
            if started is not None:
                started.cancel()
                await asyncio.gather(started, return_exceptions=True)


# Against a real Daphne: students ask, the worker publishes, the teacher reads.


def reads_from(classroom: Classroom, teachers_read: bool) -> None:
    """The teacher's setting, saved as the class page saves it (from now on, when on)."""
    classroom.refresh_from_db()
    classroom.teachers_read = teachers_read
    classroom.save(update_fields=["teachers_read", "updated_at"])


def student_joins(client: ChatClient, classroom: Classroom, nickname: str = "") -> str:
    """Join as the page's form does; the student's owner key."""
    response = client.client.post(
        "/c/",
        data={
            "code": classroom.join_code,
            "nickname": nickname,
            "csrfmiddlewaretoken": client.csrf_token,
        },
    )
    assert response.status_code == 302, response.text
    return ClassMember.objects.filter(classroom=classroom).latest("joined_at").owner_key


def live_figures(client: Client, classroom: Classroom, **wanted: int) -> dict[str, Any] | None:
    """The class's figures once they are ``wanted``, else None."""
    figures = figures_by_id(client, "5m")[str(classroom.id)]
    return figures if all(figures[k] == v for k, v in wanted.items()) else None


def text_of(events: list[Event]) -> str:
    return "".join(e.json()["text"] for e in events if e.event == "token")


@DAPHNE
def test_the_live_counts_follow_an_answer_from_waiting_to_done(
    daphne: LiveServer, world: World
) -> None:
    """While a student waits for a slow first token, their class shows one answer streaming,
    one waiting and one student active (before any record exists); another class's answer
    counts only there. Once the answers end both go back to zero and the question is counted,
    with its slow first token."""
    teacher, other = world.client("teacher"), world.client("other_teacher")
    ada, bo = ChatClient(daphne), ChatClient(daphne)
    question = "[scripted tokens=5 ttft_ms=6000 tag=live] Why is the sky blue?"
    try:
        student_joins(ada, world.physics, "Ada")
        student_joins(bo, world.chemistry, "Bo")
        idle = dict(active=0, streaming=0, waiting=0, questions=0)
        assert live_figures(teacher, world.physics, **idle)
        with ThreadPoolExecutor(2) as pool:
            asked = [pool.submit(ada.ask, question), pool.submit(bo.ask, question)]
            waiting = dict(active=1, streaming=1, waiting=1, questions=0)
            wait_for(lambda: live_figures(teacher, world.physics, **waiting), 15, 0.2)
            wait_for(lambda: live_figures(other, world.chemistry, **waiting), 15, 0.2)
            answers = [future.result(timeout=30) for future in asked]
        assert [events[-1].event for events in answers] == ["done", "done"]
        done = dict(streaming=0, waiting=0, questions=1, active=1)
        physics = wait_for(lambda: live_figures(teacher, world.physics, **done), 15, 0.2)
        wait_for(lambda: live_figures(other, world.chemistry, **done), 15, 0.2)
    finally:
        ada.close()
        bo.close()
    assert (physics["errors"], physics["abandoned"]) == (0, 0)
    assert physics["server_ttft_ms"]["count"] == 1
    assert physics["server_ttft_ms"]["p50"] >= 5000  # the scripted 6 s, not another answer's
    assert physics["client_ttft_ms"] == summary(0, None, None, None)


def send_beacon(client: ChatClient, payload: dict[str, Any]) -> None:
    """As navigator.sendBeacon sends it (``tests/assistant/test_telemetry.py``)."""
    body = {**payload, "csrf_token": client.csrf_token}
    response = client.client.post(
        "/api/chat/beacon",
        content=httpx.Request("POST", "/", json=body).content,
        headers={"Content-Type": "text/plain;charset=UTF-8"},
    )
    assert response.status_code == 204, response.text


@dataclass
class Asked:
    """One question as the student sent it and the answer as it reached them."""

    student: str
    question: str
    events: list[Event]

    @property
    def meta(self) -> dict[str, Any]:
        return self.events[0].json()

    @property
    def request_id(self) -> str:
        return str(self.meta["request_id"])

    @property
    def answer(self) -> str:
        return text_of(self.events)

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if e.event == "token")


def ask(student: str, client: ChatClient, question: str) -> Asked:
    return Asked(student, question, client.ask(question))


def csv_rows(response: Any) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith("attachment; filename=")
    body = body_of(response)
    assert body.startswith(b"\xef\xbb\xbf")
    return list(csv.reader(io.StringIO(body[3:].decode("utf-8"), newline="")))


def records_stored(classroom: Classroom, count: int) -> dict[str, StreamRecord]:
    def stored() -> dict[str, StreamRecord] | None:
        found = {r.request_id: r for r in StreamRecord.objects.filter(classroom_id=classroom.id)}
        return found if len(found) == count else None

    return wait_for(stored, 10)


def number(cell: str) -> float | None:
    return None if cell == "" else float(cell)


@DAPHNE
def test_the_csv_has_every_record_and_texts_only_where_teachers_may_read(
    daphne: LiveServer, world: World
) -> None:
    """One row per stream, oldest first: when, the nickname or else a pseudonym, the request
    id, path, engine, outcome, tokens and timings as stored (the browser's from its beacon);
    the question and the answer as the student saw them only for a class that lets its
    teachers read them; no text at all for one that does not. A cell that a spreadsheet would
    run as a formula starts with an apostrophe."""
    reads_from(world.physics, True)
    hostile = '=HYPERLINK("x")'
    ada, anon, mallory, bo = (ChatClient(daphne) for _ in range(4))
    started = timezone.now()
    try:
        keys = {
            "ada": student_joins(ada, world.physics, "Ada 李雷"),
            "anon": student_joins(anon, world.physics),
            "mallory": student_joins(mallory, world.physics, hostile),
            "bo": student_joins(bo, world.chemistry, "Bo"),
        }
        physics_asks = [
            ask("ada", ada, "[scripted tokens=4 ttft_ms=0] 为什么天空是蓝色的？"),
            # The answer is "-1 apple, \"two\"": it starts like a formula and needs quoting.
            ask("anon", anon, '[scripted text=\'["-1", " apple, \\"two\\""]\' ttft_ms=0] Count?'),
            ask("mallory", mallory, "+SUM(1,2) 等于几？\n第二行"),
            ask("ada", ada, "[scripted tokens=5 fail_after=2 ttft_ms=0] Again"),
        ]
        chemistry_asks = [ask("bo", bo, "[scripted tokens=3 ttft_ms=0] CHEM-SECRET 氧化还原?")]
        physics_records = records_stored(world.physics, 4)
        records_stored(world.chemistry, 1)
        send_beacon(
            ada, {"request_id": physics_asks[0].request_id, "outcome": "ok", "ttft_ms": 61.25}
        )
        send_beacon(
            anon,
            {"request_id": physics_asks[1].request_id, "outcome": "abandoned", "waited_ms": 900},
        )
    finally:
        for client in (ada, anon, mallory, bo):
            client.close()
    finished = timezone.now()
    assert physics_asks[1].answer == '-1 apple, "two"'
    assert physics_asks[3].events[-1].event == "error"

    rows = csv_rows(world.client("teacher").get(f"/teach/{world.physics.id}/records.csv"))
    assert rows[0] == [*CSV_HEADER.split(","), "question", "answer"]
    assert len(rows) == 1 + len(physics_asks)
    names = {
        "ada": "Ada 李雷",
        "anon": student_pseudonym(keys["anon"]),
        "mallory": "'" + hostile,
    }
    assert names["anon"].startswith("student-") and keys["anon"] not in names["anon"]
    outcomes = [("ok", ""), ("ok", ""), ("ok", ""), ("engine_error", "engine_error")]
    browser = ["61.25", "900.0", "", ""]
    times = []
    for row, asked, (outcome, error_code), browser_ttft in zip(
        rows[1:], physics_asks, outcomes, browser, strict=True
    ):
        cells = dict(zip(rows[0], row, strict=True))
        stored = physics_records[asked.request_id]
        times.append(datetime.fromisoformat(cells["time"]))
        assert cells["time"] == stored.created_at.isoformat()
        assert cells["student"] == names[asked.student]
        assert cells["request_id"] == asked.request_id
        assert (cells["serving_path"], cells["engine"]) == (
            asked.meta["path"],
            asked.meta["engine"],
        )
        assert (cells["outcome"], cells["error_code"]) == (outcome, error_code)
        assert cells["tokens"] == str(asked.tokens)
        assert stored.server_ttft_ms is not None and stored.e2e_ms is not None
        assert number(cells["server_ttft_ms"]) == stored.server_ttft_ms
        assert cells["browser_ttft_ms"] == browser_ttft
        assert number(cells["inter_token_mean_ms"]) == stored.itl_mean_ms
        assert number(cells["total_ms"]) == stored.e2e_ms
        assert stored.owner_key == keys[asked.student]
    assert times == sorted(times)
    assert started - timedelta(seconds=1) <= times[0] and times[-1] <= finished
    # Text as it was asked and answered; a formula-looking cell is text.
    texts = [(r[-2], r[-1]) for r in rows[1:]]
    assert texts == [
        (physics_asks[0].question, physics_asks[0].answer),
        (physics_asks[1].question, "'" + physics_asks[1].answer),
        ("'" + physics_asks[2].question, physics_asks[2].answer),
        (physics_asks[3].question, physics_asks[3].answer),
    ]
    assert physics_asks[3].answer  # the two tokens before the failure are kept
    assert "CHEM-SECRET" not in str(rows)

    private = csv_rows(
        world.client("other_teacher").get(f"/teach/{world.chemistry.id}/records.csv")
    )
    assert private[0] == CSV_HEADER.split(",")
    assert len(private) == 2 and len(private[1]) == len(private[0])
    cells = dict(zip(private[0], private[1], strict=True))
    assert (cells["student"], cells["request_id"]) == ("Bo", chemistry_asks[0].request_id)
    assert (cells["outcome"], cells["tokens"]) == ("ok", "3")
    body = body_of(world.client("admin").get(f"/teach/{world.chemistry.id}/records.csv"))
    assert "CHEM-SECRET" not in body.decode()
    assert "氧化" not in body.decode()
    assert chemistry_asks[0].answer not in body.decode()


@DAPHNE
def test_recent_questions_show_only_where_teachers_may_read(
    daphne: LiveServer, world: World
) -> None:
    """A class that lets its teachers read shows its questions and answers (Chinese as typed,
    markup as text) with the student's nickname; one that does not shows the notice and no
    text; turning it off hides them again."""
    reads_from(world.physics, True)
    ada, bo = ChatClient(daphne), ChatClient(daphne)
    question = "[scripted tokens=3 ttft_ms=0] 光合作用需要什么？<b>粗体</b>"
    secret = "[scripted tokens=3 ttft_ms=0] 化学作业的答案是什么？SECRET-9B"
    try:
        student_joins(ada, world.physics, "小明")
        student_joins(bo, world.chemistry, "Bo")
        answer = text_of(ada.ask(question))
        bo.ask(secret)
        records_stored(world.physics, 1)
        records_stored(world.chemistry, 1)
    finally:
        ada.close()
        bo.close()
    teacher = world.client("teacher")
    page = teacher.get(f"/teach/{world.physics.id}/questions")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="questions-private"' not in html
    assert "光合作用需要什么？&lt;b&gt;粗体&lt;/b&gt;" in html and "<b>粗体" not in html
    assert answer and answer in html
    assert "小明" in html

    private = world.client("other_teacher").get(f"/teach/{world.chemistry.id}/questions")
    html = private.content.decode()
    assert private.status_code == 200
    assert 'id="questions-private"' in html
    assert "SECRET-9B" not in html and "化学作业" not in html

    reads_from(world.physics, False)
    hidden = teacher.get(f"/teach/{world.physics.id}/questions").content.decode()
    assert 'id="questions-private"' in hidden
    assert "光合作用" not in hidden and answer not in hidden


@DAPHNE
def test_questions_asked_before_the_teacher_could_read_them_stay_unread(
    daphne: LiveServer, world: World
) -> None:
    """Students were told their teacher cannot read their questions: turning reading on later
    shows the teacher the questions asked from then on, never those from before, on the
    questions page and in the CSV."""
    student = ChatClient(daphne)
    try:
        student_joins(student, world.physics, "Ada")
        student.ask("[scripted tokens=2 ttft_ms=0] BEFORE-7Q what is a volt?")
        records_stored(world.physics, 1)
        reads_from(world.physics, True)
        student.ask("[scripted tokens=2 ttft_ms=0] AFTER-8Q what is an ampere?")
        records = records_stored(world.physics, 2)
    finally:
        student.close()
    teacher = world.client("teacher")
    html = teacher.get(f"/teach/{world.physics.id}/questions").content.decode()
    assert "AFTER-8Q" in html and "BEFORE-7Q" not in html
    rows = csv_rows(teacher.get(f"/teach/{world.physics.id}/records.csv"))
    header, body = rows[0], rows[1:]
    assert header[-2:] == ["question", "answer"]
    by_id = {row[header.index("request_id")]: row for row in body}
    assert set(by_id) == set(records)
    texts = {rid: (row[-2], row[-1]) for rid, row in by_id.items()}
    before = [t for t in texts.values() if not t[0]]
    after = [t for t in texts.values() if t[0]]
    assert len(before) == 1 and before[0] == ("", "")
    assert len(after) == 1 and "AFTER-8Q" in after[0][0] and after[0][1]
    assert "BEFORE-7Q" not in "".join(",".join(row) for row in rows)


@pytest.mark.django_db
def test_the_csv_pages_through_every_record_once_in_order(world: World) -> None:
    """Pages of 2 over 5 records, 3 of them arriving in the same microsecond: each record once,
    oldest first, ties in the order they were stored."""
    at = timezone.now() - timedelta(minutes=5)
    times = [at, at, at, at + timedelta(seconds=1), at + timedelta(seconds=2)]
    for n, created in enumerate(times):
        StreamRecord.objects.create(
            request_id=f"page-{n}",
            created_at=created,
            owner_key="session:x",
            classroom_id=world.physics.id,
            path="direct",
            engine="scripted",
            outcome="ok",
        )
    names: dict[str, str] = {}
    pages, after = [], None
    while True:
        lines, after = class_csv_page(world.physics, after=after, names=names, size=2)
        pages.append([row[2] for row in csv.reader(io.StringIO(lines, newline=""))])
        if after is None:
            break
    assert pages == [["page-0", "page-1"], ["page-2", "page-3"], ["page-4"]]


@pytest.mark.django_db
def test_an_export_that_fails_part_way_says_so_in_the_file(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the first bytes are out, a failure cannot become an error status: the file ends
    with a line saying it is cut short, and the failure is logged with its traceback."""
    from assistant import teach_dashboard_views

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(teach_dashboard_views, "class_csv_page", failing)
    response = world.client("teacher").get(f"/teach/{world.physics.id}/records.csv")
    assert response.status_code == 200
    body = body_of(response).decode("utf-8")
    assert body == "\ufeff" + CSV_HEADER + "\r\n" + teach_dashboard_views.CSV_CUT_SHORT
    failed = [r for r in caplog.records if "failed part way" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
