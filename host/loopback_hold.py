"""Hold the TCP traffic on a shared network namespace's loopback while a group's members are dumped and restored
one by one (service/group.py): a packet from a member still running (or restored first) to one dumped already (or
not restored yet) is dropped, and TCP sends it again once the hold ends, instead of the kernel answering it with a
reset that ends the ranks' connection.

The hold is one nftables table in that namespace (`table inet gpuckpt_group_hold`, a chain on the input hook
dropping TCP that arrives on lo), made and removed over netlink by pyroute2 from inside the namespace: no nft,
iptables or iproute2 program is needed (GPU machines have none). The namespace is the one the members share: a
pod's (its infra container's).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from ..errors import GpuckptError

TABLE = "gpuckpt_group_hold"
CHAIN = "input"
NFPROTO_INET = 1  # the inet family: IPv4 and IPv6 on one chain
NFT_META_IIF, NFT_META_L4PROTO = 4, 16  # the meta keys the rule reads
NF_DROP = 0
HOOK_PRIORITY = -300  # raw: before conntrack and any table of the container's own
LOOPBACK_IFINDEX = 1  # lo is the first device of every network namespace


def _rule() -> tuple[list[dict[str, Any]], ...]:
    """`iif lo meta l4proto tcp drop`, as nftables' expressions."""
    from pyroute2.nftables.expressions import genex, verdict  # deferred: only a group operation pays for it

    def equals(value: bytes) -> list[dict[str, Any]]:
        return [genex("cmp", {"sreg": 1, "op": 0, "data": {"attrs": [("NFTA_DATA_VALUE", value)]}})]
    return ([genex("meta", {"dreg": 1, "key": NFT_META_IIF})], equals(struct.pack("=I", LOOPBACK_IFINDEX)),
            [genex("meta", {"dreg": 1, "key": NFT_META_L4PROTO})], equals(bytes([socket.IPPROTO_TCP])),
            verdict(NF_DROP))


class LoopbackHold:
    """The hold on the loopback of the network namespace /proc/`pid`/ns/net."""

    def __init__(self, pid: int) -> None:
        self.netns = f"/proc/{pid}/ns/net"
        self.held = False

    def _in_netns(self, action: str) -> None:
        from pyroute2.netns import popns, pushns  # deferred, as above
        from pyroute2.nftables.main import NFTables

        pushns(self.netns)  # the netlink socket is made inside, and stays there
        try:
            nft = NFTables(nfgen_family=NFPROTO_INET)
        finally:
            popns()
        try:
            if action == "hold":
                nft.table("add", name=TABLE)
                nft.chain("add", table=TABLE, name=CHAIN, hook="input", type="filter", priority=HOOK_PRIORITY)
                nft.rule("add", table=TABLE, chain=CHAIN, expressions=_rule())
            else:
                nft.table("del", name=TABLE)
        finally:
            nft.close()

    def hold(self) -> None:
        try:
            self._in_netns("hold")
        except Exception as error:  # noqa: BLE001 -- pyroute2's netlink errors have no common base but Exception
            self.held = True  # whatever part was made goes with the table
            leftover = self.release()
            raise GpuckptError(f"the loopback of {self.netns} could not be held ({type(error).__name__}: {error})"
                               + (f"; {leftover[0]}" if leftover else "")) from None
        self.held = True

    def release(self) -> list[str]:
        """The hold gone; what could not be released, one line."""
        if not self.held:
            return []
        try:
            self._in_netns("release")
        except Exception as error:  # noqa: BLE001 -- as above
            if "No such file" in str(error) or getattr(error, "code", None) == 2:  # ENOENT: no table left
                self.held = False
                return []
            return [f"the hold on the loopback of {self.netns} could not be released ({type(error).__name__}: "
                    f"{error}): remove the nftables table inet {TABLE} there"]
        self.held = False
        return []
