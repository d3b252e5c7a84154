"""The termination notices of the common clouds' metadata services, as gpuckptd polls them.

- GCE: GET .../computeMetadata/v1/instance/preempted answers TRUE once the VM is preempted
  (30 s before it stops).
- AWS: GET /latest/meta-data/spot/instance-action is 404 until a notice, then
  {"action": "terminate"|"stop"|"hibernate", "time": "2026-11-25T05:20:00Z"}.
- Azure: GET /metadata/scheduledevents lists {"Events": [{"EventType": "Preempt", "NotBefore":
  "Wed, 25 Nov 2026 05:20:00 GMT", "Resources": ["vm-name", ...], ...}]}: the events of every VM in
  the same availability set or scale set; only those naming this VM are its notices.
Any other 200 whose body is TRUE also counts. Bodies are bounded and parsed into these models:
the metadata service is the operator's choice, but a proxy in between is not.
"""

from __future__ import annotations

import email.utils
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

MAX_NOTICE_BYTES = 64 << 10
AZURE_LOSING_EVENTS = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy"})  # the VM's memory is lost


class AwsInstanceAction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    action: Literal["terminate", "stop", "hibernate"]
    time: datetime


class AzureEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")
    EventType: str
    NotBefore: str = ""
    Resources: list[str] = []  # the VMs it is for


class AzureScheduledEvents(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Events: list[AzureEvent] = []


@dataclass(frozen=True)
class Notice:
    source: str  # what said so, for the report
    deadline_s: float | None  # seconds left, when the notice names a time


def _seconds_until(moment: datetime, now: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a time without a zone: the services all speak UTC
    return max(0.0, (moment - now).total_seconds())


def parse_notice(status: int, body: bytes, now: datetime | None = None, vm_name: str | None = None) -> Notice | None:
    """A notice from one answer of a metadata service, or None (no notice yet, or not an answer we know).
    vm_name: this VM's name (Azure's), when known: an event naming only other VMs is theirs."""
    now = now or datetime.now(UTC)
    if status != 200 or len(body) > MAX_NOTICE_BYTES:
        return None
    text = body.decode("utf-8", "replace").strip()
    if text.upper() == "TRUE":
        return Notice("the metadata service answered TRUE (GCE: preempted)", None)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    try:
        action = AwsInstanceAction.model_validate(document)
        return Notice(f"AWS spot instance-action {action.action} at {action.time.isoformat()}",
                      _seconds_until(action.time, now))
    except ValidationError:
        pass
    try:
        events = AzureScheduledEvents.model_validate(document)
    except ValidationError:
        return None
    for event in events.Events:
        if vm_name and event.Resources and vm_name.lower() not in {name.lower() for name in event.Resources}:
            continue
        if event.EventType in AZURE_LOSING_EVENTS:
            try:
                when = email.utils.parsedate_to_datetime(event.NotBefore) if event.NotBefore else None
            except (TypeError, ValueError):
                when = None  # a notice all the same; its time unknown
            named = f"Azure scheduled event {event.EventType}" + (f" not before {event.NotBefore}" if when else "")
            return Notice(named, _seconds_until(when, now) if when else None)
    return None
