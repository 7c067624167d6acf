"""Planetoid files fetched into the cache when no --data-dir is given: from a loopback HTTP server serving the
local Cora copy (never the network), checksummed, reused, and a clear line when offline or corrupted."""

from __future__ import annotations

import functools
import http.server
import shutil
import socket
import threading
from pathlib import Path

import pytest

from distgnn.data import download
from distgnn.data.datasets import DatasetSpec, load_dataset
from distgnn.errors import InputError

CORA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "planetoid").resolve()
pytestmark = pytest.mark.skipif(not (CORA / "ind.cora.x").exists(), reason=f"Cora files not found at {CORA}")


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server over a copy of the Cora files; yields (base URL, served directory, request log)."""
    served = tmp_path / "served"
    shutil.copytree(CORA, served)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            requests.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served, requests
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(download.DATA_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "planetoid"


def test_cora_without_data_dir_downloads_once_into_the_cache(server, cache, monkeypatch):
    url, _, requests = server
    monkeypatch.setenv(download.URL_ENV, url)
    graph = load_dataset(DatasetSpec("cora"))
    assert graph.num_nodes == 2708 and graph.num_edges == 10556
    assert sorted(p.name for p in cache.iterdir()) == sorted(download.planetoid_files("cora"))
    assert len(requests) == 8
    load_dataset(DatasetSpec("cora"))  # the second load reads the cache
    assert len(requests) == 8


def test_a_corrupted_download_is_refused_and_nothing_kept(server, cache, monkeypatch):
    url, served, _ = server
    (served / "ind.cora.graph").write_bytes(b"not the graph")
    monkeypatch.setenv(download.URL_ENV, url)
    with pytest.raises(InputError, match="ind.cora.graph: sha256 .* was expected"):
        load_dataset(DatasetSpec("cora"))
    assert not (cache / "ind.cora.graph").exists()
    assert not list(cache.glob("*.part"))


def test_offline_names_the_directory_to_put_the_files_in(cache, monkeypatch):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(download.URL_ENV, f"http://127.0.0.1:{port}")
    with pytest.raises(InputError, match=f"offline\\? put the files ind.cora.x.* in {cache}"):
        load_dataset(DatasetSpec("cora"))


def test_an_explicit_data_dir_is_never_downloaded_into(tmp_path, monkeypatch):
    monkeypatch.setenv(download.URL_ENV, "http://127.0.0.1:9")
    with pytest.raises(InputError, match="ind.cora"):
        load_dataset(DatasetSpec("cora", data_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []
