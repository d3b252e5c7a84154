"""Preemption: a notice (the metadata URL polled, a file appearing, SIGUSR1) starts one drain
whose deadline is the notice's time less a margin, or service.preemption_deadline_s; the watch is
a state machine (PreemptionWatch) that `gpuckpt service status` shows and `gpuckpt service reset` clears.

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
from ..node.container_record import container_label
from ..oci.timestamps import utc_at, utc_now
from .api import ContainerEvent, Event, Preemption, PreemptionState, Result
from .cloud_notices import MAX_NOTICE_BYTES, Notice, parse_notice
from .operations import Operations, drained
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
    """The state machine the service's loop drives (`check`, each tick) and `gpuckpt service reset` steers:

    watching --a notice--> draining --its drain ends--> drained --reset, or the service's next start--> watching

    One notice, one drain: while draining or drained the sources still say so (GCE keeps answering TRUE), so
    later notices belong to this preemption; periodic checkpoints and idle reclaim wait (the node is going,
    and what the drain stopped is not theirs). A reset while a source still gives notice is refused: it would
    drain again at the next tick."""

    def __init__(self, config: ServiceConfig, operations: Operations, signalled: threading.Event) -> None:
        self.config, self.operations, self.signalled = config, operations, signalled
        self._lock = threading.Lock()  # the loop, the drain's thread and the API's reset change the state
        self.state: PreemptionState = "watching"
        self._notice_view = Preemption(state="watching", sources=self.sources())
        self._polled: Notice | None = None  # the poller's latest answer
        self._polled_at: str | None = None
        self._poller: threading.Thread | None = None

    @property
    def pending(self) -> bool:
        """A notice taken and not yet cleared: periodic checkpoints wait."""
        return self.state != "watching"

    def sources(self) -> list[str]:
        return [source for source in (self.config.preemption_url, self.config.preemption_file) if source] + ["SIGUSR1"]

    def view(self) -> Preemption:
        with self._lock:
            return self._notice_view.model_copy(update={"state": self.state})

    def check(self) -> None:
        if self.config.preemption_url and self._poller is None:
            # its own thread, polling for the service's life: a metadata service that answers a byte at a time
            # holds the poll, not the service; and a reset must know whether the notice still stands
            self._poller = threading.Thread(target=self._poll, name="preemption-poll", daemon=True)
            self._poller.start()
        if self.state != "watching":
            return
        notice = self._notice()
        if notice is None:
            return
        self.signalled.clear()  # taken: a SIGUSR1 is one notice
        wait_s = notice.deadline_s if notice.deadline_s is not None else self.config.preemption_deadline_s
        deadline = max(0.001, wait_s - MARGIN_S)
        with self._lock:
            self.state = "draining"
            self._notice_view = Preemption(state="draining", sources=self.sources(), source=notice.source,
                                           noticed_at=utc_now(), deadline_at=utc_at(time.time() + wait_s))
        log(f"preemption notice: {notice.source}; draining with a {deadline:.1f} s deadline; periodic checkpoints "
            "wait until `gpuckpt service reset`", PHASE="preemption")
        notify(f"STATUS=preemption: draining, {deadline:.0f} s")
        threading.Thread(target=self._drain, args=(deadline,), name="preemption", daemon=True).start()

    def reset(self) -> Result:
        """Back to watching, where the preemption's drain has ended and no source still gives notice."""
        with self._lock:
            if self.state == "watching":
                return Result(ok=True, message="no preemption to clear: watching " + ", ".join(self.sources()))
            if self.state == "draining":
                return Result(ok=False, message="the preemption's drain is under way: reset once it ends "
                                                "(gpuckpt service status)")
            standing = self._standing()
            if standing:
                return Result(ok=False, message=f"not cleared: {standing}, so the next tick would drain again; "
                                                "clear the preemption once it does not")
            cleared = self._notice_view
            self.state = "watching"
            self._notice_view = Preemption(state="watching", sources=self.sources())
            self.signalled.clear()  # a SIGUSR1 while it was pending was part of it
        log(f"preemption cleared (noticed {cleared.noticed_at}: {cleared.source}): watching again, periodic "
            "checkpoints resume", PHASE="preemption")
        notify(f"STATUS=serving {self.config.socket}")
        waiting = len(drained(self.config.archive_dir))  # restored already, or nothing drained: no hint
        hint = f"; `gpuckpt service restore` brings back the {waiting} container(s) its drain left" if waiting else ""
        return Result(ok=True, message=f"preemption cleared (noticed {cleared.noticed_at}: {cleared.source}); "
                                       f"watching again, periodic checkpoints resume{hint}")

    def _standing(self) -> str:
        """Which source still gives notice, as a clause; empty if none does."""
        if self.config.preemption_file and os.path.exists(self.config.preemption_file):
            return f"{self.config.preemption_file} still exists (remove it)"
        if self._polled is not None:
            return f"{self.config.preemption_url} still gives notice (polled {self._polled_at})"
        return ""

    def _notice(self) -> Notice | None:
        if self.signalled.is_set():
            return Notice("SIGUSR1", None)
        if self.config.preemption_file and os.path.exists(self.config.preemption_file):
            return Notice(f"{self.config.preemption_file} exists", None)
        return self._polled

    def _poll(self) -> None:
        while True:
            try:
                polled = poll_url(self.config.preemption_url, self.config.preemption_proxy)
                self._polled = polled and Notice(f"{self.config.preemption_url}: {polled.source}", polled.deadline_s)
                self._polled_at = utc_now()
            except Exception as error:  # noqa: BLE001 -- the poller's thread must not die: an answer no check foresaw is logged, and polled again
                log(f"preemption: polling {self.config.preemption_url}: {type(error).__name__}: {error}")
            time.sleep(self.config.preemption_poll_s)

    def _drain(self, deadline_s: float) -> None:
        message = "drain: ended without a result"
        try:
            labels: dict[str, str] = {}  # each container as its drain's lines name it

            def heard(event: Event) -> None:
                if isinstance(event, ContainerEvent):
                    labels[event.id] = container_label(event.name, event.id)

            result = self.operations.drain(heard, deadline_s, wait=True)
            message = result.message

            def named(ids: list[str]) -> str:
                return ", ".join(labels.get(cid) or container_label(None, cid) for cid in ids) or "none"

            log(f"preemption {result.message}; made it: {named(result.done)}; not started: {named(result.skipped)}",
                PHASE="preemption")
            notify(f"STATUS=preemption: {result.message}; `gpuckpt service reset` clears it")
        except Exception as error:  # noqa: BLE001 -- a drain's bug must not leave the state draining for good
            message = f"drain failed: {type(error).__name__}: {error}"
            log(f"preemption {message}", PHASE="preemption")
        finally:
            with self._lock:
                self.state = "drained"
                self._notice_view = self._notice_view.model_copy(update={"state": "drained", "drain": message})
