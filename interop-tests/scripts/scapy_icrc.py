#!/usr/bin/env python3
"""Recompute the RoCE v2 ICRC of frames with scapy (an implementation nobody here wrote).

Reads one hex-encoded Ethernet frame per line on stdin and prints, per line,
the 4 ICRC bytes scapy computes for it (hex, as they sit on the wire), or
`error: ...` when scapy does not see a BTH in the frame.
"""
import sys

from scapy.compat import raw
from scapy.contrib.roce import BTH  # noqa: F401  (binds UDP port 4791 to BTH)
from scapy.layers.l2 import Ether

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    pkt = Ether(bytes.fromhex(line))
    if BTH not in pkt:
        print("error: no BTH")
        continue
    pkt[BTH].icrc = None  # make scapy compute it when rebuilding
    print(raw(pkt)[-4:].hex())
sys.stdout.flush()
