"""Students in a class: what reaches the engine on both serving paths, a paused class, the
per-class limit and engine, the visibility banner, joining, and conversations per class.

The scripted engine records every start with the messages and the sampling it was given, so
these tests read what really reached the engine, in the server's own process.
"""

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from assistant.models import ClassMember, Classroom, Conversation, StreamRecord
from assistant.services.classrooms import CLASS_COOKIE, join_code_new
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PHYSICS = "You are a patient physics tutor. Never hand out homework answers: ask guiding questions."
CHEMISTRY = "你是一位耐心的化学老师。用简单的中文回答，不要直接给出作业答案。"


def make_class(**fields: Any) -> Classroom:
    return Classroom.objects.create(
        name=fields.pop("name", "Physics 8A"), join_code=join_code_new(), **fields
    )


def join(client: ChatClient, code: str, nickname: str = "") -> Any:
    """Join as the page's form does (CSRF token from the cookie), without following."""
    return client.client.post(
        "/c/", data={"code": code, "nickname": nickname, "csrfmiddlewaretoken": client.csrf_token}
    )


def starts(server: LiveServer, tag: str) -> list[dict[str, Any]]:
    return [row for row in server.engine_events(tag) if row["event"] == "start"]


def ask_tagged(client: ChatClient, tag: str, path: str, tokens: int = 20) -> list[Any]:
    return client.ask(f"[scripted tokens={tokens} ttft_ms=0 tag={tag}] Why?", url=path)


@pytest.mark.parametrize("path", ["direct", "django"])
def test_the_class_persona_and_sampling_reach_the_engine(daphne: LiveServer, path: str) -> None:
    """Each question of a class member starts the engine once, with the class's persona as the
    system prompt and its temperature and max tokens; the answer stops at that length."""
    classroom = make_class(persona=PHYSICS, temperature=0.2, max_tokens=4)
    client = ChatClient(daphne)
    try:
        assert join(client, classroom.join_code, "Mei").status_code == 302
        assert client.cookies()[CLASS_COOKIE] == str(classroom.id)
        url = f"/api/chat/stream/{path}"
        for n in range(2):  # the first read of the class here, then the early start on it
            tag = f"persona-{path}-{n}-{uuid.uuid4().hex[:6]}"
            events = ask_tagged(client, tag, url)
            assert sum(1 for e in events if e.event == "token") == 4
            (start,) = starts(daphne, tag)
            assert start["given"][0] == ["system", PHYSICS]
            assert start["params"]["temperature"] == 0.2
            assert start["params"]["max_tokens"] == 4
    finally:
        client.close()
    member = ClassMember.objects.get(classroom=classroom)
    assert member.nickname == "Mei"
    records = wait_for(lambda: list(StreamRecord.objects.filter(classroom_id=classroom.id)) or None)
    assert {r.owner_key for r in records} == {member.owner_key}


@pytest.mark.parametrize("path", ["direct", "django"])
def test_without_a_class_the_site_persona_answers(daphne: LiveServer, path: str) -> None:
    from django.conf import settings

    client = ChatClient(daphne)
    try:
        tag = f"noclass-{path}-{uuid.uuid4().hex[:6]}"
        ask_tagged(client, tag, f"/api/chat/stream/{path}", tokens=2)
    finally:
        client.close()
    (start,) = starts(daphne, tag)
    assert start["given"][0] == ["system", settings.CHATSITE_STREAM["SYSTEM_PROMPT"]]
    assert CLASS_COOKIE not in client.cookies()


def test_a_persona_changed_by_the_teacher_reaches_the_next_question(daphne: LiveServer) -> None:
    """The process knows the class from an earlier question; the teacher changes it; the next
    question's early start on the old copy is thrown away and the new persona answers."""
    classroom = make_class(persona=PHYSICS)
    client = ChatClient(daphne)
    try:
        join(client, classroom.join_code)
        ask_tagged(client, f"warm-{uuid.uuid4().hex[:6]}", "/api/chat/stream/direct", tokens=1)
        classroom.persona = CHEMISTRY
        classroom.save()
        tag = f"changed-{uuid.uuid4().hex[:6]}"
        events = ask_tagged(client, tag, "/api/chat/stream/direct", tokens=3)
    finally:
        client.close()
    assert sum(1 for e in events if e.event == "token") == 3
    given = [start["given"][0] for start in starts(daphne, tag)]
    assert given[-1] == ["system", CHEMISTRY]
    assert all(system == ["system", PHYSICS] for system in given[:-1])


def test_a_class_cookie_naming_another_class_never_sets_the_persona(daphne: LiveServer) -> None:
    """The cookie is a guess: a student of one class who names another in it gets their own
    class's persona (and the other class's settings never reach their answer)."""
    mine = make_class(persona=PHYSICS, max_tokens=3)
    other = make_class(name="Chemistry 9B", persona=CHEMISTRY, max_tokens=50)
    outsider = ChatClient(daphne)
    student = ChatClient(daphne)
    try:
        join(outsider, other.join_code)
        ask_tagged(outsider, f"other-{uuid.uuid4().hex[:6]}", "/api/chat/stream", tokens=1)
        join(student, mine.join_code)
        student.client.cookies.set(CLASS_COOKIE, str(other.id))
        tag = f"forged-{uuid.uuid4().hex[:6]}"
        events = ask_tagged(student, tag, "/api/chat/stream/direct", tokens=20)
    finally:
        outsider.close()
        student.close()
    assert sum(1 for e in events if e.event == "token") == 3
    assert starts(daphne, tag)[-1]["given"][0] == ["system", PHYSICS]


@pytest.mark.parametrize("path", ["direct", "django"])
def test_a_paused_class_gets_a_message_and_no_answer(daphne: LiveServer, path: str) -> None:
    classroom = make_class(persona=PHYSICS)
    client = ChatClient(daphne)
    try:
        join(client, classroom.join_code)
        classroom.paused = True
        classroom.save()
        page = client.client.get("/")
        assert 'id="class-paused"' in page.text
        tag = f"paused-{path}-{uuid.uuid4().hex[:6]}"
        response = client.post_stream(
            {"message": f"[scripted tag={tag}] Hi", "conversation": None},
            url=f"/api/chat/stream/{path}",
        )
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "class_paused"
        assert starts(daphne, tag) == []
        classroom.paused = False
        classroom.save()
        events = ask_tagged(client, f"reopened-{uuid.uuid4().hex[:6]}", "/api/chat/stream", 2)
        assert events[-1].event == "done"
    finally:
        client.close()


def test_the_class_rate_limit_applies_to_its_students(daphne: LiveServer) -> None:
    classroom = make_class(chat_rate=1)
    client = ChatClient(daphne)
    try:
        join(client, classroom.join_code)
        assert ask_tagged(client, f"rate-{uuid.uuid4().hex[:6]}", "/api/chat/stream", 1)
        response = client.post_stream({"message": "again", "conversation": None})
        assert response.status_code == 429
        assert response.json()["error"]["code"] == "rate_limited"
        assert int(response.headers["retry-after"]) >= 1
    finally:
        client.close()


def test_the_class_engine_alias_answers(daphne_factory) -> None:
    """A class naming the "candidate" alias is answered by it (here a scripted engine that
    sends 3 tokens by default), on the baseline path too."""
    server = daphne_factory(
        CHATSITE_CANDIDATE_ENGINE="scripted",
        CHATSITE_CANDIDATE_SCRIPTED_TOKENS="3",
        CHATSITE_CANDIDATE_SCRIPTED_TTFT_MS="0",
    )
    classroom = make_class(engine_alias="candidate")
    client = ChatClient(server)
    try:
        plain = client.ask("[scripted ttft_ms=0] Hi", url="/api/chat/stream/direct")
        join(client, classroom.join_code)
        for _ in range(2):  # a late switch of engine, then the early start on the right one
            events = client.ask("Hi", url="/api/chat/stream/direct")
            assert sum(1 for e in events if e.event == "token") == 3
    finally:
        client.close()
    assert sum(1 for e in plain if e.event == "token") == 20


@pytest.mark.parametrize("teachers_read", [True, False])
def test_the_banner_says_what_the_teacher_can_read(daphne: LiveServer, teachers_read) -> None:
    classroom = make_class(name="Biology 7C", teachers_read=teachers_read)
    client = ChatClient(daphne)
    try:
        joining = client.client.get(f"/c/{classroom.join_code.lower()}")
        join(client, classroom.join_code)
        page = client.client.get("/", headers={"Accept-Language": "en"})
        page_zh = client.client.get("/", headers={"Accept-Language": "zh-CN"})
    finally:
        client.close()
    reads = "can read the questions you ask"
    not_reads = "not what you ask"
    for html in (joining.text, page.text):
        assert "Biology 7C" in html
        assert f'data-teachers-read="{str(teachers_read).lower()}"' in html
        assert (reads in html) is teachers_read
        assert (not_reads in html) is (not teachers_read)
    zh_reads, zh_not = "老师可以看到你在这个班级里提的问题", "看不到你问了什么"
    assert (zh_reads in page_zh.text) is teachers_read
    assert (zh_not in page_zh.text) is (not teachers_read)


def test_joining_with_a_bad_code_says_why(daphne: LiveServer) -> None:
    expired = make_class(code_expires_at=timezone.now() - timedelta(minutes=1))
    client = ChatClient(daphne)
    try:
        unknown = join(client, "ZZZZZZ")
        late = client.client.get(f"/c/{expired.join_code}")
        too_long = join(client, make_class().join_code, "x" * 41)
    finally:
        client.close()
    assert unknown.status_code == 404 and 'id="join-error"' in unknown.text
    assert late.status_code == 410
    assert too_long.status_code == 400
    assert not ClassMember.objects.exists()
    assert CLASS_COOKIE not in client.cookies()


def test_conversations_belong_to_the_class_they_began_in(daphne: LiveServer) -> None:
    """Joining shows the class's conversations only; one begun outside cannot be continued
    inside; leaving brings the others back."""
    classroom = make_class()
    client = ChatClient(daphne)
    try:
        before = client.ask("[scripted tokens=1 ttft_ms=0] Before")[0].json()["conversation"]
        # Stored by the group writer just after the answer's last frame, not before it.
        wait_for(lambda: Conversation.objects.filter(id=before).exists())
        join(client, classroom.join_code)
        inside = client.ask("[scripted tokens=1 ttft_ms=0] Inside")[0].json()["conversation"]
        wait_for(lambda: Conversation.objects.filter(id=inside).exists())
        listed = client.client.get("/api/conversations").json()["conversations"]
        assert [c["id"] for c in listed] == [inside]
        response = client.post_stream({"message": "more", "conversation": before})
        assert response.status_code == 404
        left = client.client.post("/c/leave", headers={"X-CSRFToken": client.csrf_token})
        assert left.status_code == 302
        listed = client.client.get("/api/conversations").json()["conversations"]
        assert [c["id"] for c in listed] == [before]
        assert CLASS_COOKIE not in client.cookies()
    finally:
        client.close()
    assert Conversation.objects.get(id=inside).classroom_id == classroom.id
    assert Conversation.objects.get(id=before).classroom_id is None
    member = ClassMember.objects.get(classroom=classroom)
    assert member.left_at is not None


def test_migrating_keeps_conversations_in_no_class() -> None:
    before, after = ("assistant", "0008_message_replaced_at"), ("assistant", "0009_classes")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    conversation = old.get_model("assistant", "Conversation").objects.create(
        owner_key="session:abc", title="Tides"
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([after])
    new = executor.loader.project_state([after]).apps
    kept = new.get_model("assistant", "Conversation").objects.get(id=conversation.id)
    group = new.get_model("auth", "Group").objects.get(name="Teachers")
    # Back to the latest schema, whatever came after, for the tests that follow.
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert kept.title == "Tides" and kept.classroom_id is None
    assert [p.codename for p in group.permissions.all()] == ["teach"]
    assert re.fullmatch(r"[A-Z2-9]{6}", join_code_new())


@pytest.mark.parametrize("path", ["direct", "django"])
def test_a_page_that_showed_another_class_or_policy_is_refused(
    daphne: LiveServer, path: str
) -> None:
    """The page says which class it showed and what it said the teacher reads; a question sent
    under words that no longer hold is refused (409 ``class_changed``) before any answer."""
    classroom = make_class(teachers_read=False)
    client = ChatClient(daphne)
    url = f"/api/chat/stream/{path}"

    def send(shown: dict[str, Any], tag: str) -> Any:
        body = {"message": f"[scripted tokens=1 ttft_ms=0 tag={tag}] Hi", "conversation": None}
        return client.post_stream({**body, **shown}, url=url)

    try:
        join(client, classroom.join_code)
        mine = str(classroom.id)
        stale = [
            ({"class": None, "teachers_read": False}, "no class shown"),
            ({"class": mine, "teachers_read": True}, "the other policy shown"),
            ({"class": str(uuid.uuid4()), "teachers_read": False}, "another class shown"),
        ]
        for shown, why in stale:
            tag = f"stale-{uuid.uuid4().hex[:6]}"
            response = send(shown, tag)
            assert response.status_code == 409, why
            assert response.json()["error"]["code"] == "class_changed", why
            assert starts(daphne, tag) == [] or all(
                row["event"] != "finish" for row in daphne.engine_events(tag)
            ), why
        ok = send({"class": mine, "teachers_read": False}, f"fresh-{uuid.uuid4().hex[:6]}")
        assert ok.status_code == 200 and "event: done" in ok.text
        assert send({"class": "nope", "teachers_read": False}, "bad").status_code == 400
        assert send({"class": mine, "teachers_read": "yes"}, "bad").status_code == 400
        # The teacher turns reading on: the page that said "cannot read" is now stale.
        classroom.teachers_read = True
        classroom.save()
        response = send({"class": mine, "teachers_read": False}, "turned-on")
        assert response.json()["error"]["code"] == "class_changed"
    finally:
        client.close()


@pytest.mark.usefixtures("rate_clock_held")
def test_only_wrong_codes_count_against_an_address() -> None:
    """A whole class behind one address joins (right codes are not counted); 60 wrong codes a
    minute are answered 404, then the address is refused even a right code (429), so it cannot
    tell one from the other by trying."""
    from django.core.cache import cache
    from django.test import Client

    cache.clear()
    classroom = make_class()
    for n in range(70):
        response = Client().post("/c/", {"code": classroom.join_code, "nickname": f"s{n}"})
        assert response.status_code == 302, n
    guesser = Client()
    for n in range(60):
        assert guesser.post("/c/", {"code": f"ZZZZ{n:02d}"}).status_code == 404, n
    refused = guesser.post("/c/", {"code": classroom.join_code})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert Client().get(f"/c/{classroom.join_code}").status_code == 429
    assert ClassMember.objects.filter(classroom=classroom).count() == 70
    cache.clear()


def test_a_class_deleted_while_its_student_is_answered_loses_nothing(daphne: LiveServer) -> None:
    """The class goes while an answer streams: the new conversation, the question and the
    answer are stored all the same, in no class."""
    classroom = make_class()
    client = ChatClient(daphne)
    try:
        join(client, classroom.join_code)
        stream = client.stream("[scripted tokens=30 ttft_ms=800 itl_ms=20] Tell me about tides")
        events = [next(stream)]
        meta = events[0].json()
        Classroom.objects.filter(id=classroom.id).delete()
        events += list(stream)
    finally:
        client.close()
    assert events[-1].event == "done"
    conversation = wait_for(lambda: Conversation.objects.filter(id=meta["conversation"]).first())
    assert conversation.classroom_id is None
    stored = wait_for(
        lambda: (
            list(Conversation.objects.get(id=conversation.id).messages.all())
            if Conversation.objects.get(id=conversation.id).messages.count() == 2
            else None
        )
    )
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].status == "complete"


def test_a_refused_stale_page_costs_no_question_of_the_rate(daphne: LiveServer) -> None:
    """``class_changed`` is decided with the session, before the rate limit counts."""
    classroom = make_class(chat_rate=1)
    client = ChatClient(daphne)
    try:
        join(client, classroom.join_code)
        stale = {"class": None, "teachers_read": False}
        for _ in range(3):
            refused = client.post_stream({"message": "Hi", "conversation": None, **stale})
            assert refused.json()["error"]["code"] == "class_changed"
        shown = {"class": str(classroom.id), "teachers_read": False}
        answered = client.post_stream(
            {"message": "[scripted tokens=1 ttft_ms=0] Hi", "conversation": None, **shown}
        )
        assert answered.status_code == 200 and "event: done" in answered.text
    finally:
        client.close()
