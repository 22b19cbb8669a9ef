"""Power loss: every state a power cut could leave (powerloss.py states the model) recovers
with nothing acknowledged lost and nothing torn read; and the checker notices a missing fsync."""

from __future__ import annotations

import logging

import powerloss
import pytest

from fsjobstore import _fsops, _skeleton


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("fsjobstore").setLevel(logging.CRITICAL)


def test_every_power_cut_state_of_a_durable_run_recovers_with_nothing_acknowledged_lost() -> None:
    report = powerloss.run()
    assert report["calls_recorded"] > 50
    assert report["states_checked"] > 500
    assert report["problems"] == []


def test_the_checker_catches_a_missing_directory_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fsops, "sync_applied", lambda path, *, durable: None)
    report = powerloss.run()
    assert any("acknowledged job" in p and "is lost" in p for p in report["problems"]), report["problems"][:5]


def test_the_checker_catches_a_missing_file_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _fsops.write_new
    monkeypatch.setattr(_fsops, "write_new", lambda path, data, *, durable, **kw: real(path, data, durable=False, **kw))
    report = powerloss.run()
    assert any("not a whole job file" in p for p in report["problems"]), report["problems"][:5]


def test_every_power_cut_of_a_store_made_with_durable_false_leaves_a_store_that_opens() -> None:
    report = powerloss.run_not_durable()
    assert report["states_checked"] > 1000
    assert report["problems"] == []
    assert report["lost_reported"] > 0  # the cuts that lose jobs say so, through recover()


def test_the_not_durable_checker_catches_a_store_marker_written_without_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _fsops.write_new

    def marker_not_synced(path: str, data: bytes, *, durable: bool, **kw: int) -> None:
        real(path, data, durable=durable and ".init" not in path, **kw)

    monkeypatch.setattr(_fsops, "write_new", marker_not_synced)
    monkeypatch.setattr(_skeleton, "_looks_like_store", lambda layout: False)  # no second chance
    report = powerloss.run_not_durable()
    assert any("StoreNotFound" in p or "StoreFormatError" in p for p in report["problems"]), report["problems"][:3]
