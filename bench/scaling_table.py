#!/usr/bin/env python3
"""The data-parallel scaling table of docs/training.md for GPT-2 small, by calculation.

Step time = compute + exchange (posembed train does not overlap them). Each rank
computes one micro-batch of one 1024-token sequence per step (so the global batch
is N sequences); its exchange moves what a ring all-reduce does,
2 (N-1)/N x 4 P bytes, in 2 (N-1) messages each paying the link's latency:

    exchange = 2 (N-1) latency + 2 (N-1)/N x 4 P / bandwidth

Usage: bench/scaling_table.py GFLOPS_PER_RANK ...
  GFLOPS_PER_RANK: training FLOP rate of one rank (docs/training.md uses the default
  model's rate measured on this machine by bench/data_parallel.sh, and one 100x
  faster to show where the links start to matter); one table per rate
"""
import sys

PARAMS = 124_439_808                  # GPT-2 small (posembed plan gpt2)
FLOPS_PER_SEQUENCE = 874.94e9         # training, T = 1024 (posembed plan gpt2)
LINKS = {  # name: (bytes per second, latency per message in seconds; assumed, typical)
    "10 Gb/s Ethernet": (10e9 / 8, 25e-6),
    "100 Gb/s InfiniBand": (100e9 / 8, 1.5e-6),
}


def exchange_seconds(ranks, bandwidth, latency):
    return 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * 4 * PARAMS / bandwidth


def table(rate):
    compute = FLOPS_PER_SEQUENCE / rate
    print(f"compute per rank and step: {compute:.2f} s (one 1024-token sequence at "
          f"{rate / 1e9:.1f} GFLOP/s)\n")
    head = "| ranks | MB per rank |"
    rule = "|---|---|"
    for name in LINKS:
        head += f" {name}: exchange, step, efficiency |"
        rule += "---|"
    print(head)
    print(rule)
    for n in (2, 4, 8, 16, 32, 64):
        row = f"| {n} | {2 * (n - 1) / n * 4 * PARAMS / 1e6:.0f} |"
        for bandwidth, latency in LINKS.values():
            t = exchange_seconds(n, bandwidth, latency)
            row += f" {t * 1e3:.0f} ms, {compute + t:.2f} s, {compute / (compute + t):.1%} |"
        print(row)
    print()


if __name__ == "__main__":
    for gflops in sys.argv[1:]:
        table(float(gflops) * 1e9)
