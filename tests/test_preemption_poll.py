"""The preemption poller against real local HTTP servers: it follows no redirect and reads no proxy
variable (both would send its requests, and AWS's token, where the metadata service did not say),
and uses a proxy only where service.preemption_proxy names one."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from gpuckpt.node.config import ServiceConfig
from gpuckpt.service import preemption, systemd
from gpuckpt.service.preemption import poll_url


class Server:
    """An HTTP server on 127.0.0.1 in a thread; answers every GET with `status` and `headers`, body TRUE."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.paths: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                outer.paths.append(self.path)
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"TRUE")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/computeMetadata/v1/instance/preempted"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


@pytest.fixture
def stderr_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's log lines on stderr (as without systemd), where capfd reads them."""
    monkeypatch.setattr(systemd, "JOURNAL_SOCKET", "/nonexistent/journal-socket")
    monkeypatch.setattr(preemption, "_redirects_logged", set())


@pytest.mark.hostile("a preemption metadata URL answering 302 to another server (the poll would carry its "
                     "headers there)")
def test_a_redirect_is_not_followed_and_is_logged_once(servers, stderr_log, capfd) -> None:
    elsewhere = Server()
    servers.append(elsewhere)
    redirecting = Server(302, {"Location": elsewhere.url})
    servers.append(redirecting)
    with urllib.request.build_opener().open(redirecting.url, timeout=2) as followed:  # urllib's default opener
        assert followed.read() == b"TRUE"
    assert len(elsewhere.paths) == 1
    elsewhere.paths.clear()

    assert poll_url(redirecting.url) is None
    assert poll_url(redirecting.url) is None
    assert elsewhere.paths == [] and len(redirecting.paths) == 3
    logged = [line for line in capfd.readouterr().err.splitlines() if "redirect" in line]
    assert len(logged) == 1, logged
    assert f"{redirecting.url} answered 302, a redirect to '{elsewhere.url}': not followed" in logged[0]


@pytest.mark.hostile("http_proxy/https_proxy set in the service's environment while it polls the metadata URL")
def test_proxy_variables_are_ignored(servers, monkeypatch) -> None:
    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.settimeout(0.5)
    proxy_url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    metadata = Server()
    servers.append(metadata)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy"):
        monkeypatch.setenv(name, proxy_url)
    try:
        with pytest.raises(OSError):  # what urllib's default opener does: it asks the proxy (which never answers)
            urllib.request.build_opener().open(metadata.url, timeout=1)
        seen, _ = proxy.accept()
        seen.close()

        notice = poll_url(metadata.url)
        assert notice is not None and "TRUE" in notice.source
        assert len(metadata.paths) == 1
        with pytest.raises(TimeoutError):
            proxy.accept()[0].close()  # nothing more came to the proxy
    finally:
        proxy.close()


def test_a_configured_proxy_is_used(servers, monkeypatch) -> None:
    proxy = Server()  # http.server answers the proxy's request line (the absolute URL) itself
    servers.append(proxy)
    proxy_url = proxy.url.split("/computeMetadata")[0]
    config = ServiceConfig(preemption_url="http://169.254.169.254/computeMetadata/v1/instance/preempted",
                           preemption_proxy=proxy_url)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # the variable still is not what is used
    assert poll_url(config.preemption_url, config.preemption_proxy) is not None
    assert proxy.paths == [config.preemption_url]
