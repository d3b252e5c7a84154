"""Hold the TCP traffic on a shared network namespace's loopback while a group's members are dumped and restored
one by one (service/group.py): a packet from a member still running (or restored first) to one dumped already (or
not restored yet) is dropped, and TCP sends it again once the hold ends, instead of the kernel answering it with a
reset that ends the ranks' connection.

Held by one nftables table in that namespace (iptables where nft is missing), entered by nsenter; released by
removing it. The namespace is the one the members share: a pod's (its infra container's) or a container's they
all join.
"""

from __future__ import annotations

from ..errors import GpuckptError
from . import process
from .programs import find_program

TABLE = "gpuckpt_group_hold"
NFT_RULES = f"""table inet {TABLE} {{
  chain input {{
    type filter hook input priority raw; policy accept;
    iif "lo" meta l4proto tcp drop
  }}
}}
"""
IPTABLES_RULE = ["INPUT", "-i", "lo", "-p", "tcp", "-m", "comment", "--comment", TABLE, "-j", "DROP"]


class LoopbackHold:
    """The hold on the loopback of the network namespace /proc/`pid`/ns/net."""

    def __init__(self, pid: int) -> None:
        self.netns = f"/proc/{pid}/ns/net"
        nsenter = find_program("nsenter")
        if nsenter is None:
            raise GpuckptError("nsenter (util-linux) is not on PATH: it holds the group's loopback traffic")
        self.enter = [nsenter, f"--net={self.netns}", "--"]
        self.nft = find_program("nft")
        self.iptables = None if self.nft else find_program("iptables")
        if not self.nft and not self.iptables:
            raise GpuckptError("neither nft nor iptables is on PATH: one holds the group's loopback traffic")
        self.held = False

    def hold(self) -> None:
        if self.nft:
            process.run([*self.enter, self.nft, "-f", "-"], input_text=NFT_RULES, timeout_s=30)
        else:
            process.run([*self.enter, str(self.iptables), "-w", "-I", *IPTABLES_RULE], timeout_s=30)
        self.held = True

    def release(self) -> list[str]:
        """The hold gone; what could not be released, one line."""
        if not self.held:
            return []
        if self.nft:
            done = process.run([*self.enter, self.nft, "delete", "table", "inet", TABLE], timeout_s=30, check=False)
        else:
            done = process.run([*self.enter, str(self.iptables), "-w", "-D", *IPTABLES_RULE], timeout_s=30, check=False)
        if done.returncode != 0:
            return [f"the hold on the loopback of {self.netns} could not be released ({done.stderr.strip()[-200:]}): "
                    f"remove the {TABLE} rule there"]
        self.held = False
        return []
