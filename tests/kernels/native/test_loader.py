"""The native library's loader: one line where the kernels cannot be had, the sources found
where the package is installed, and a build required where SPECLAB_REQUIRE_NATIVE=1 (CI)."""

import logging
import os

import pytest

from speclab.kernels import native


def test_the_sources_and_header_ship_beside_the_loader():
    for path in (*native.SOURCES, native.HEADER):
        assert path.is_file(), path


@pytest.mark.skipif(os.environ.get("SPECLAB_REQUIRE_NATIVE") != "1", reason="SPECLAB_REQUIRE_NATIVE is not 1")
def test_the_library_builds_where_it_is_required():
    assert native.load() is not None, "the native CPU kernels did not build (see the log line above)"


@pytest.mark.parametrize("how", ["no compiler", "SPECLAB_NATIVE=0"])
def test_unavailable_kernels_say_so_in_one_line(how, monkeypatch, caplog):
    monkeypatch.setattr(native, "_said_unavailable", False)
    if how == "no compiler":
        monkeypatch.setattr(native, "_compiler", lambda: None)
    else:
        monkeypatch.setenv("SPECLAB_NATIVE", "0")
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        for march in ("native", "haswell"):  # past the cache: each call looks again
            assert native.load.__wrapped__(march) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "native CPU kernels are unavailable" in lines[0] and "torch path" in lines[0]
    assert "\n" not in lines[0]


def test_a_failed_build_says_so_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(native, "_said_unavailable", False)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.load.__wrapped__("native") is None
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
