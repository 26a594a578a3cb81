"""An inline chain stops at a worker's shutdown: ``stopping()`` sees Celery's signal (sent in
the main process) through memory shared with the pool processes, and Celery's own flags."""

from __future__ import annotations

import mmap
import os

import pytest
from celery.signals import worker_init, worker_shutting_down
from celery.worker import state as worker_state

from celery_sagas._celery import inline


@pytest.fixture
def fresh_flag(monkeypatch: pytest.MonkeyPatch) -> mmap.mmap:
    """A shutdown byte of this test's own (the module's is shared by the whole process)."""
    flag = mmap.mmap(-1, 1)
    monkeypatch.setattr(inline, "_SHUTDOWN", flag)
    monkeypatch.setattr(worker_state, "should_stop", None)
    monkeypatch.setattr(worker_state, "should_terminate", None)
    return flag


def test_not_stopping_until_the_worker_shuts_down(fresh_flag: mmap.mmap) -> None:
    assert not inline.stopping()
    worker_shutting_down.send(sender="w@h", sig="SIGTERM", how="Warm", exitcode=0)
    assert inline.stopping()


def test_celerys_own_flags_count_even_when_the_exit_code_is_zero(
        fresh_flag: mmap.mmap, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_state, "should_stop", 0)  # a warm shutdown's EX_OK
    assert inline.stopping()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_before_the_signal_sees_it(fresh_flag: mmap.mmap) -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the pool process: waits for the main process's signal, then reports
        os.close(write)
        os.read(read, 1)
        os._exit(0 if inline.stopping() else 1)
    os.close(read)
    worker_shutting_down.send(sender="w@h", sig="SIGTERM", how="Warm", exitcode=0)
    os.write(write, b"x")
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_worker_forked_from_the_same_process_as_a_stopped_one_is_not_stopping(
        fresh_flag: mmap.mmap) -> None:
    # Two workers forked from one process that imported the module (a fork server, a
    # supervisor): the first one's shutdown must not stop the second one's inline chains.
    read, write = os.pipe()
    second = os.fork()
    if second == 0:  # the second worker starts once the first one has stopped
        os.close(write)
        os.read(read, 1)
        worker_init.send(sender=None)
        os._exit(1 if inline.stopping() else 0)
    os.close(read)
    worker_shutting_down.send(sender="w@h", sig="SIGTERM", how="Warm", exitcode=0)  # the first
    os.write(write, b"x")
    _, status = os.waitpid(second, 0)
    assert os.waitstatus_to_exitcode(status) == 0
