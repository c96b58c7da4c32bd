"""Students driven in a closed loop (C at a time) or an open loop (arrivals at a fixed rate)."""

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from .client import STREAM_PATHS, EndpointNotFound, Sample, Student

Arrival = Literal["poisson", "constant"]
OnSample = Callable[["Sample"], None]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What to send. With ``rate`` (requests/s) the loop is open and ``concurrency`` only caps
    the requests in flight (``None``: no cap); without it, ``concurrency`` students each ask
    their next question as soon as their previous answer ends (closed loop)."""

    base_url: str
    prompts: Sequence[str]
    requests: int
    concurrency: int | None = 1
    rate: float | None = None
    arrival: Arrival = "poisson"
    path: str = "auto"
    timeout: float = 60.0
    warmup: int = 0
    keepalive: bool = False
    seed: int | None = None

    @property
    def stream_url(self) -> str:
        return self.base_url.rstrip("/") + STREAM_PATHS[self.path]

    def student(self) -> Student:
        return Student(
            base_url=self.base_url, path=self.path, timeout=self.timeout, keepalive=self.keepalive
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    plan: LoadPlan
    samples: list[Sample]
    duration_s: float


@asynccontextmanager
async def _task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group whose first failure cancels the others and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except ExceptionGroup as failures:
        error: BaseException = failures
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        raise error from None


async def _ask(plan: LoadPlan, student: Student, i: int, worker: int, epoch: float) -> Sample:
    prompt_index = i % len(plan.prompts)
    sample = await student.ask(
        plan.prompts[prompt_index], index=i, worker=worker, prompt_index=prompt_index, epoch=epoch
    )
    if sample.error == "404":  # a 404 without our JSON error body: no such endpoint
        raise EndpointNotFound(plan.stream_url)
    return sample


async def _closed_loop(
    plan: LoadPlan, students: list[Student], count: int, epoch: float, on_sample: OnSample
) -> None:
    next_index = itertools.count()

    async def student_loop(worker: int) -> None:
        while (i := next(next_index)) < count:
            on_sample(await _ask(plan, students[worker], i, worker, epoch))

    async with _task_group() as group:
        for worker in range(len(students)):
            group.create_task(student_loop(worker))


async def _open_loop(
    plan: LoadPlan, students: list[Student], epoch: float, on_sample: OnSample
) -> None:
    assert plan.rate is not None
    rate, rng = plan.rate, random.Random(plan.seed)
    idle = list(students)
    cap = asyncio.Semaphore(plan.concurrency or plan.requests)

    async def arrive(i: int, due: float) -> None:
        async with cap:
            if idle:
                student = idle.pop()
            else:  # every student is busy: one more walks in and loads the page first
                student = plan.student()
                students.append(student)
                await student.open()
            sample = await _ask(plan, student, i, students.index(student), epoch)
            idle.append(student)
        sample.scheduled_s = round(due, 6)
        on_sample(sample)

    due = 0.0
    async with _task_group() as group:
        for i in range(plan.requests):
            await asyncio.sleep(max(0.0, epoch + due - time.perf_counter()))
            group.create_task(arrive(i, due))
            due += rng.expovariate(rate) if plan.arrival == "poisson" else 1 / rate


async def run_benchmark(plan: LoadPlan, *, on_sample: OnSample | None = None) -> RunResult:
    """Prepare the students (one page load each), ask ``plan.warmup`` unrecorded questions, then
    the measured ones. Raises :class:`BenchmarkError` when the site cannot be measured at all."""
    students = [plan.student() for _ in range(plan.concurrency or 1)]
    samples: list[Sample] = []

    def record(sample: Sample) -> None:
        samples.append(sample)
        if on_sample is not None:
            on_sample(sample)

    try:
        async with _task_group() as group:
            for student in students:
                group.create_task(student.open())
        if plan.warmup:
            await _closed_loop(plan, students[: plan.warmup], plan.warmup, 0.0, lambda s: None)
        epoch = time.perf_counter()
        if plan.rate is None:
            await _closed_loop(plan, students, plan.requests, epoch, record)
        else:
            await _open_loop(plan, students, epoch, record)
        duration = time.perf_counter() - epoch
    finally:
        await asyncio.gather(*(student.aclose() for student in students))
    samples.sort(key=lambda s: s.index)
    return RunResult(plan=plan, samples=samples, duration_s=duration)
