"""Preemption: a notice (the metadata URL polled, a file appearing, SIGUSR1) starts one drain
whose deadline is the notice's time less a margin, or service.preemption_deadline_s.

The drain orders containers smallest first, so the most of them are checkpointed before the
node goes; the report names those that made it and those skipped.
"""

from __future__ import annotations

import http.client
import os
import re
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from ..node.config import ServiceConfig
from .cloud_notices import MAX_NOTICE_BYTES, Notice, parse_notice
from .operations import Operations, unheard
from .systemd import log, notify

MARGIN_S = 3.0  # what the drain leaves of the notice's time for the last checkpoint to finish
# GCE and Azure refuse requests without their header; each ignores the other's.
HEADERS = {"Metadata-Flavor": "Google", "Metadata": "true"}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect answered is an HTTPError of its 3xx, never followed: a metadata service never redirects, and
    a redirect would carry its headers (and AWS's token) elsewhere."""

    def redirect_request(self, req: urllib.request.Request, fp: object, code: int, msg: str,  # noqa: PLR0917 -- urllib's
                         headers: object, newurl: str) -> None:
        return None


def metadata_opener(proxy: str = "") -> urllib.request.OpenerDirector:
    """An opener that follows no redirect and reads no proxy variable (http_proxy, https_proxy, no_proxy: any
    process's environment could send the poll elsewhere); `proxy` (service.preemption_proxy) where the operator
    names one."""
    proxies = {"http": proxy, "https": proxy} if proxy else {}
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect())


_redirects_logged: set[str] = set()


def _aws_token(url: str, opener: urllib.request.OpenerDirector) -> str | None:
    """IMDSv2's session token, where the URL is AWS's metadata service and it hands one out."""
    parts = urlsplit(url)
    request = urllib.request.Request(f"{parts.scheme}://{parts.netloc}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    try:
        with opener.open(request, timeout=2) as answer:
            return answer.read(4096).decode("ascii", "replace").strip() or None
    except (OSError, urllib.error.URLError):
        return None


_azure_vm_names: dict[str, str] = {}  # by scheduled-events URL, once known


def _azure_vm_name(url: str, opener: urllib.request.OpenerDirector) -> str | None:
    """This VM's name from Azure's instance metadata (beside the scheduled events); None if it does not say,
    and then every losing event counts: a needless drain costs less than a missed one."""
    if url in _azure_vm_names:
        return _azure_vm_names[url]
    parts = urlsplit(url)
    request = urllib.request.Request(
        f"{parts.scheme}://{parts.netloc}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
        headers={"Metadata": "true"})
    try:
        with opener.open(request, timeout=2) as answer:
            name: str = answer.read(256).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return None
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,80}", name):
        return None
    _azure_vm_names[url] = name
    return name


def poll_url(url: str, proxy: str = "") -> Notice | None:
    opener = metadata_opener(proxy)
    headers = dict(HEADERS)
    if "/latest/meta-data/" in url and (token := _aws_token(url, opener)):
        headers["X-aws-ec2-metadata-token"] = token
    vm_name = _azure_vm_name(url, opener) if "/metadata/scheduledevents" in url else None
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=2) as answer:
            return parse_notice(answer.status, answer.read(MAX_NOTICE_BYTES + 1), vm_name=vm_name)
    except urllib.error.HTTPError as error:
        if 300 <= error.code < 400 and url not in _redirects_logged:
            _redirects_logged.add(url)  # once: it is polled every few seconds
            where = str(error.headers.get("Location", "?"))[:200] if error.headers else "?"
            log(f"preemption: {url} answered {error.code}, a redirect to {where!r}: not followed (a metadata "
                "service answers itself); no notice is read from it", PHASE="preemption")
        return parse_notice(error.code, b"")
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return None  # the metadata service not answering (or not speaking HTTP) is not a notice


class PreemptionWatch:
    """Checked by the service's loop; drains once per notice, in a thread of its own."""

    def __init__(self, config: ServiceConfig, operations: Operations, signalled: threading.Event) -> None:
        self.config, self.operations, self.signalled = config, operations, signalled
        self._polled: Notice | None = None  # set by the poller thread
        self._poller: threading.Thread | None = None
        self._draining: threading.Thread | None = None
        self.handled = False

    def check(self) -> None:
        if self.handled:
            return
        notice = self._notice()
        if notice is None:
            return
        self.handled = True
        deadline = max(0.001, (notice.deadline_s if notice.deadline_s is not None
                               else self.config.preemption_deadline_s) - MARGIN_S)
        log(f"preemption notice: {notice.source}; draining with a {deadline:.1f} s deadline", PHASE="preemption")
        notify(f"STATUS=preemption: draining, {deadline:.0f} s")
        self._draining = threading.Thread(target=self._drain, args=(deadline,), name="preemption", daemon=True)
        self._draining.start()

    def _notice(self) -> Notice | None:
        if self.signalled.is_set():
            return Notice("SIGUSR1", None)
        if self.config.preemption_file and os.path.exists(self.config.preemption_file):
            return Notice(f"{self.config.preemption_file} exists", None)
        if self.config.preemption_url and self._poller is None:
            # its own thread: a metadata service that answers a byte at a time holds the poll, not the service
            self._poller = threading.Thread(target=self._poll, name="preemption-poll", daemon=True)
            self._poller.start()
        return self._polled

    def _poll(self) -> None:
        while self._polled is None:
            try:
                self._polled = poll_url(self.config.preemption_url, self.config.preemption_proxy)
            except Exception as error:  # noqa: BLE001 -- the poller's thread must not die: an answer no check foresaw is logged, and polled again
                log(f"preemption: polling {self.config.preemption_url}: {type(error).__name__}: {error}")
            time.sleep(self.config.preemption_poll_s)

    def _drain(self, deadline_s: float) -> None:
        result = self.operations.drain(unheard, deadline_s, wait=True)
        log(f"preemption {result.message}; made it: {', '.join(result.done) or 'none'}; "
            f"not started: {', '.join(result.skipped) or 'none'}", PHASE="preemption")
        notify(f"STATUS=preemption: {result.message}")
