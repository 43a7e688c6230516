"""What a pass costs the hardware, for the GPU check's graphs stage (`benchmarks/gpu_graphs.py`):
the weight-streaming bound (a pass reads every weight once, so it cannot take less than their
bytes over the device's copy bandwidth), and where a pass's device time goes, kernel by
kernel. A pass that misses its bound does so in its kernels (which ones: the products,
attention, the elementwise rest) or between them (the device idle while the host launches):
the busy time against the wall time tells which, and the kernels' names which attention
backend ran.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from targetrows.core.tree import Tree
from targetrows.decoding.model import synchronize


def copy_bandwidth(device: str, smoke: bool) -> float:
    """Bytes/s of a device-to-device copy of a large buffer (read + write counted)."""
    n = (1 << 20) if smoke else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * n / float(np.median(times))


def weight_bytes(model) -> int:
    """The bytes of an `HFModel`'s weights: what one pass reads at least once."""
    return sum(p.numel() * p.element_size() for p in model.model.parameters())


def kernel_breakdown(model, ctx: list[int], n: int, top: int = 8) -> dict:
    """Where one pass feeding n nodes on the cached `ctx` spends its device time: the `top`
    kernels by the time they took (on the CPU: operations), names cut at their template
    arguments and summed over those that share a name, each with its calls; all of them
    together (the device's busy time) against the pass's wall time measured apart, unprofiled
    (the rest the device idles: launches, the host)."""
    on_gpu = model.device.type == "cuda"
    rng = np.random.default_rng(0)
    tokens = rng.choice(model.vocab_size, size=n, replace=False)
    tree = Tree(np.concatenate([[ctx[-1]], tokens]), np.array([-1] + [0] * n))
    model.reset(0)
    model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    model.commit(ctx)

    def one_pass() -> float:
        t = time.perf_counter()
        model.logits(ctx, tree, np.arange(1, n + 1))
        synchronize(model)
        model.commit(ctx)  # drops the tree's entries
        return time.perf_counter() - t

    one_pass()  # warm-up
    wall = float(np.median([one_pass() for _ in range(3)]))
    # the CPU's activity too on a GPU, as torch's own examples profile: kernels are recorded
    # with the launches that made them
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        one_pass()
    totals: dict[str, list[float]] = {}
    for e in prof.key_averages():
        if on_gpu and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.self_device_time_total if on_gpu else e.self_cpu_time_total
        entry = totals.setdefault(_kernel_name(e.key), [0.0, 0])
        entry[0] += us / 1e6
        entry[1] += e.count
    model.reset(0)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return {"wall_s": wall, "busy_s": sum(s for s, _ in totals.values()),
            "top": [(name, s, int(calls)) for name, (s, calls) in ranked[:top]]}


def _kernel_name(name: str) -> str:
    """A kernel's name without its return type, template and call arguments."""
    name = name.removeprefix("void ")
    for cut in ("<", "("):
        name = name.split(cut, 1)[0] or name
    return name.replace("|", "/")[:70]


def kernels_markdown(breakdowns: dict, device: bool) -> str:
    """`kernel_breakdown`s by n as a report section; `device`: kernels (else CPU operations)."""
    what = "kernels" if device else "operations (no CUDA device: the CPU's, self time)"
    lines = ["### Where a pass's time goes", "",
             "The target's padded pass run eagerly (what its graph replays), feeding n nodes on "
             f"the cached context, profiled: its busiest {what}. Busy: all of their times "
             "summed; wall: the pass measured apart, unprofiled (busy well under wall: the "
             "device idles between launches).", ""]
    for n, b in breakdowns.items():
        lines += [f"n={n}: wall {b['wall_s'] * 1e3:.2f} ms, busy {b['busy_s'] * 1e3:.2f} ms.",
                  "", "| kernel | ms | calls | share of busy |", "|---|---|---|---|"]
        lines += [f"| `{name}` | {s * 1e3:.3f} | {calls} | "
                  f"{s / b['busy_s']:.0%} |" if b["busy_s"] else f"| `{name}` | - | {calls} | - |"
                  for name, s, calls in b["top"]]
        lines.append("")
    return "\n".join(lines).rstrip()
