"""The agent's task log store: tail, follow across a rotation, links and foreign files never read, log requests."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.logstore import CHUNK_BYTES, LogService, TaskLog, _chunks, valid_task_id
from common.pb.gptrm.v1 import agent_pb2


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fh.write(data)


def _rotate(log: TaskLog) -> None:
    """What the log pump does at a rotation: the live file becomes the copy, a new live file starts."""
    os.replace(log.path, log.rotated)


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(first, last + 1))


class TestTaskLogTail:
    def test_last_lines_of_the_live_file(self, tmp_path: Path) -> None:
        """tail(2) returns exactly the last two complete lines."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, _lines(1, 10))
        data, cursor = log.tail(2)
        assert data == b"line 9\nline 10\n"
        assert cursor.offset == log.size()

    def test_partial_last_line_counts_as_a_line(self, tmp_path: Path) -> None:
        """A last line without its newline yet is one of the N lines."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, b"a\nb\nc")
        assert log.tail(2)[0] == b"b\nc"

    def test_more_lines_than_the_file_has(self, tmp_path: Path) -> None:
        """Asking for more lines than exist returns the whole file."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, _lines(1, 3))
        assert log.tail(50)[0] == _lines(1, 3)

    def test_zero_means_everything_retained(self, tmp_path: Path) -> None:
        """tail(0) returns the rotated copy followed by the live file."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, _lines(1, 5))
        _rotate(log)
        _write(log.path, _lines(6, 7))
        assert log.tail(0)[0] == _lines(1, 7)

    def test_tail_reaches_into_the_rotated_copy(self, tmp_path: Path) -> None:
        """When the live file holds fewer lines than asked, the rest comes from output.log.1."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, _lines(1, 5))
        _rotate(log)
        _write(log.path, b"line 6\n")
        assert log.tail(3)[0] == _lines(4, 6)

    def test_tail_across_many_blocks(self, tmp_path: Path) -> None:
        """Lines far larger than one read block are found whole."""
        log = TaskLog(tmp_path / "output.log")
        big = b"x" * 200_000 + b"\n"
        _write(log.path, b"first\n" + big + big)
        assert log.tail(2)[0] == big + big

    def test_tail_bounded_by_limit(self, tmp_path: Path) -> None:
        """A tail never reads more than its byte limit, whatever the line count."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, b"y" * 100_000)
        data, _ = log.tail(1, limit=4096)
        assert len(data) == 4096


class TestLinksAndForeignFiles:
    def test_a_link_in_place_of_the_log_is_never_read(self, tmp_path: Path) -> None:
        """A symlink standing for output.log or output.log.1 reads as no log at all, not as its target."""
        secret = tmp_path / "secret"
        secret.write_bytes(b"root only\n")
        secret.chmod(0o600)
        log = TaskLog(tmp_path / "t" / "output.log")
        log.path.parent.mkdir()
        log.path.symlink_to(secret)
        log.rotated.symlink_to(secret)
        assert not log.exists()
        assert log.tail(0)[0] == b""
        assert log.read_from(log.tail(0)[1], 1024)[0] == b""

    def test_a_file_of_another_owner_is_never_read(self, tmp_path: Path) -> None:
        """A log file the agent's user does not own (a hard link a task made, say) is not read back."""
        if os.geteuid() != 0:
            pytest.skip("needs root to make a file of another owner")
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, b"planted\n")
        os.chown(log.path, 65534, 65534)
        assert log.tail(0)[0] == b""


class TestReadFrom:
    def test_follow_across_a_rotation(self, tmp_path: Path) -> None:
        """A reader at an offset past the truncated file gets the rest of the copy, then the new file."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, b"one\n")
        _, cursor = log.tail(0)
        _write(log.path, b"two\nthree\n")
        _rotate(log)
        _write(log.path, b"four\n")
        got = b""
        for _ in range(5):
            data, cursor = log.read_from(cursor, 1024)
            got += data
        assert got == b"two\nthree\nfour\n"


    def test_follow_without_rotation_reads_only_new_bytes(self, tmp_path: Path) -> None:
        """Without a rotation, a reader gets exactly what was appended after its cursor."""
        log = TaskLog(tmp_path / "output.log")
        _write(log.path, b"one\n")
        _, cursor = log.tail(0)
        _write(log.path, b"two\n")
        data, cursor = log.read_from(cursor, 1024)
        assert data == b"two\n"
        assert log.read_from(cursor, 1024)[0] == b""


class TestChunks:
    def test_chunks_are_bounded_and_cut_after_newlines(self) -> None:
        """Each chunk is at most CHUNK_BYTES and ends after a newline when one is in reach; nothing is lost."""
        data = (b"a" * 1000 + b"\n") * 200
        pieces = _chunks(data)
        assert all(len(p) <= CHUNK_BYTES for p in pieces)
        assert all(p.endswith(b"\n") for p in pieces)
        assert b"".join(pieces) == data

    def test_a_line_longer_than_a_chunk_is_split(self) -> None:
        """A line with no newline in reach is cut at CHUNK_BYTES."""
        data = b"q" * (CHUNK_BYTES * 2 + 5)
        pieces = _chunks(data)
        assert [len(p) for p in pieces] == [CHUNK_BYTES, CHUNK_BYTES, 5]


class TestValidTaskId:
    @pytest.mark.parametrize("task_id", ["", ".", "..", "a/b", "../x", "a b", "x" * 254, "a\\b"])
    def test_refuses_ids_that_are_no_single_directory(self, task_id: str) -> None:
        """Ids that could name a path outside tasks/ are refused."""
        assert not valid_task_id(task_id)

    def test_accepts_ordinary_ids(self) -> None:
        """A generated task id is accepted."""
        assert valid_task_id("t-3f2a9c")


async def _answer(svc: LogService, req: agent_pb2.LogRequest) -> list[agent_pb2.LogChunk]:
    out: list[agent_pb2.LogChunk] = []
    done = asyncio.Event()

    async def send(chunk: agent_pb2.LogChunk) -> None:
        out.append(chunk)
        if chunk.eof:
            done.set()

    svc.handle(req, send)
    await asyncio.wait_for(done.wait(), timeout=10)
    return out


async def _until_true(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``check`` on the event loop until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _sent(out: list[agent_pb2.LogChunk], data: bytes) -> None:
    """Wait until the chunks sent so far carry exactly ``data``."""
    await _until_true(lambda: b"".join(c.data for c in out) == data)


class TestLogService:
    def test_tail_answer_ends_with_eof(self, tmp_path: Path) -> None:
        """A tail request gets the last lines then one eof chunk, all carrying the request id."""
        _write(tmp_path / "tasks" / "t1" / "output.log", _lines(1, 5))
        svc = LogService(tmp_path, running=lambda _: False)
        chunks = asyncio.run(_answer(svc, agent_pb2.LogRequest(request_id="r1", task_id="t1", tail_lines=2)))
        assert b"".join(c.data for c in chunks) == b"line 4\nline 5\n"
        assert chunks[-1].eof and not chunks[-1].error
        assert {c.request_id for c in chunks} == {"r1"}

    def test_missing_log_is_not_found(self, tmp_path: Path) -> None:
        """A task with no log on this node gets one eof chunk with not_found and an error naming it."""
        svc = LogService(tmp_path, running=lambda _: False)
        chunks = asyncio.run(_answer(svc, agent_pb2.LogRequest(request_id="r1", task_id="nope")))
        assert len(chunks) == 1 and chunks[0].not_found and "nope" in chunks[0].error

    def test_path_escaping_id_is_refused(self, tmp_path: Path) -> None:
        """A task id naming a path outside tasks/ is refused without reading anything."""
        (tmp_path / "secret").write_bytes(b"x")
        svc = LogService(tmp_path, running=lambda _: False)
        chunks = asyncio.run(_answer(svc, agent_pb2.LogRequest(request_id="r1", task_id="..")))
        assert chunks[0].error and not chunks[0].data

    def test_follow_sends_new_output_until_the_task_ends(self, tmp_path: Path) -> None:
        """A follower receives lines written after it started and ends once the task is gone."""
        path = tmp_path / "tasks" / "t1" / "output.log"
        _write(path, b"old\n")
        running = {"t1"}
        svc = LogService(tmp_path, running=lambda t: t in running, poll_s=0.01)

        async def scenario() -> list[agent_pb2.LogChunk]:
            out: list[agent_pb2.LogChunk] = []

            async def send(chunk: agent_pb2.LogChunk) -> None:
                out.append(chunk)

            svc.handle(agent_pb2.LogRequest(request_id="r", task_id="t1", tail_lines=1, follow=True), send)
            await _sent(out, b"old\n")      # the tail is out: what is written next is new output
            _write(path, b"new 1\n")
            await _sent(out, b"old\nnew 1\n")
            _write(path, b"new 2\n")
            running.clear()
            await _until_true(lambda: bool(out) and out[-1].eof)
            return out

        chunks = asyncio.run(scenario())
        assert b"".join(c.data for c in chunks) == b"old\nnew 1\nnew 2\n"
        assert chunks[-1].eof

    def test_cancel_stops_a_follower(self, tmp_path: Path) -> None:
        """A cancel request ends the follower it names; no eof is sent for it."""
        _write(tmp_path / "tasks" / "t1" / "output.log", b"x\n")
        svc = LogService(tmp_path, running=lambda _: True, poll_s=0.01)
        sent: list[agent_pb2.LogChunk] = []

        async def send(chunk: agent_pb2.LogChunk) -> None:
            sent.append(chunk)

        async def scenario() -> None:
            svc.handle(agent_pb2.LogRequest(request_id="r", task_id="t1", follow=True), send)
            await _sent(sent, b"x\n")        # the follower is running
            follower = svc._active["r"]
            svc.handle(agent_pb2.LogRequest(request_id="r", cancel=True), send)
            await asyncio.wait([follower], timeout=10)
            assert follower.done()

        asyncio.run(scenario())
        assert not svc._active
        assert not any(c.eof for c in sent)
