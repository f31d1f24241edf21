"""bench.py's report: the ratios of a run's rows against the best DataLoader, and the
Markdown and console tables with what each number includes (bench/README.md)."""
from measure import POLL_S, PSS_EVERY, fmt, machine_line

CONSUME_DESC = {"copy": "a copy of every tensor, `t.clone()`, as the host side of `.to(device)` does",
                "sum": "`t.sum()` of every tensor"}


def add_ratios(rows):
    """Per dataset: each row's median samples/s ÷ the best DataLoader's, and its samples
    per CPU-second ÷ the best DataLoader's samples per CPU-second (per core)."""
    for ds in ("records", "tokens"):
        dls = [r for r in rows if r["dataset"] == ds and r["loader"] == "DataLoader"]
        best = max(dls, key=lambda r: r["samples_per_s"], default=None)
        best_cpu = max((r for r in dls if r["samples_per_cpu_s"]), key=lambda r: r["samples_per_cpu_s"],
                       default=None)
        for r in rows:
            if r["dataset"] != ds:
                continue
            if not r.get("touch", True):
                # The hand-off alone reads no byte: no ratio against a loop that reads them all.
                r["ratio_vs_best_dataloader"] = r["per_cpu_ratio_vs_best_dataloader"] = None
                continue
            r["ratio_vs_best_dataloader"] = (r["samples_per_s"] / best["samples_per_s"]
                                             if best and best["samples_per_s"] > 0 else None)
            r["best_dataloader_workers"] = best["workers"] if best else None
            r["per_cpu_ratio_vs_best_dataloader"] = (
                r["samples_per_cpu_s"] / best_cpu["samples_per_cpu_s"]
                if best_cpu and r["samples_per_cpu_s"] else None)
            r["best_per_cpu_dataloader_workers"] = best_cpu["workers"] if best_cpu else None


def row_name(r):
    if r["loader"] == "loaderd":
        if r["client"] == "python":
            return "loaderd, Python client"
        if not r.get("touch", True):
            return "loaderd, hand-off alone (`loaderctl read`, no byte read) ⁴"
        return "loaderd, C client (`loaderctl read --touch`)"
    return "DataLoader"


def client_name(r):
    if r["client"] == "python":
        return "Python client"
    return "C client" if r.get("touch", True) else "hand-off alone"


# #15's target for the hand-off of token windows: daemon + client CPU a window, and windows/s.
HANDOFF_TARGET_US, HANDOFF_TARGET_PER_S = 0.6, 3e6


def handoff_lines(rows):
    out = []
    for r in rows:
        if r["loader"] != "loaderd" or r.get("touch", True) or not r.get("cpu_s_per_1000"):
            continue
        us = r["cpu_s_per_1000"] * 1000
        met = us <= HANDOFF_TARGET_US and r["samples_per_s"] >= HANDOFF_TARGET_PER_S
        out.append(f"- {r['dataset']}, the hand-off alone: {us:.2f} µs of daemon + client CPU a sample "
                   f"(min–max {r['cpu_s_per_1000_min'] * 1000:.2f}–{r['cpu_s_per_1000_max'] * 1000:.2f}), "
                   f"{r['samples_per_s']:,.0f} samples/s; target ≤ {HANDOFF_TARGET_US} µs and ≥ "
                   f"{HANDOFF_TARGET_PER_S / 1e6:.0f} M/s: {'met' if met else 'not met'}.")
    return out


def row_workers(r):
    if r["loader"] == "loaderd":
        return f"{r['workers']} threads"
    return str(r["workers"]) + (f", prefetch {r['prefetch_factor']}" if r["workers"] and r.get("prefetch_factor")
                                else "")


def render(rows, meta):
    lines = []
    m = meta["machine"]
    p = meta["params"]
    lines.append(f"# loaderd vs PyTorch DataLoader — {m['date']}")
    lines.append("")
    lines.append(machine_line(m))
    lines.append("")
    lines.append(f"Data{' (--quick)' if p['quick'] else ''}: records = {p['files']:,} files × "
                 f"{p['file_size']} B in {p['classes']} classes (batch {p['records_batch']}); "
                 f"tokens = {p['tokens']:,} uint16 tokens, windows of {p['context'] + 1} (batch {p['tokens_batch']}). "
                 f"Page cache warm; shuffle on. Every configuration: {p['runs']} runs (interleaved), each a "
                 f"fresh trainer process that reads epoch 0 (not timed) and then {p['timed_epochs']} timed epochs; "
                 "the figures are the medians over the runs, with the spread of samples/s (min–max).")
    lines.append("")
    hdr = ["dataset", "loader", "workers", "samples/s (median)", "min–max", "CPU s / 1,000 samples",
           "samples per CPU-second", "peak RSS MiB", "peak PSS MiB", "÷ best DataLoader", "÷ best DataLoader per CPU-s"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "|".join(["---"] * 3 + ["---:"] * (len(hdr) - 3)) + "|")
    for r in rows:
        rt, rc = r.get("ratio_vs_best_dataloader"), r.get("per_cpu_ratio_vs_best_dataloader")
        bold = r["loader"] == "loaderd" and r["client"] == "python"
        lines.append("| " + " | ".join([
            r["dataset"], row_name(r), row_workers(r),
            fmt(r["samples_per_s"], ",.0f"),
            f"{r['samples_per_s_min']:,.0f}–{r['samples_per_s_max']:,.0f}",
            fmt(r["cpu_s_per_1000"], ".3f") + (" ³" if r.get("cpu_includes_epoch0") else ""),
            fmt(r["samples_per_cpu_s"], ",.0f"),
            fmt(r["peak_rss_mib"], ",.0f"), fmt(r["peak_pss_mib"], ",.0f"),
            (f"**{rt:.2f}×**" if bold else f"{rt:.2f}×") if rt is not None else "—",
            (f"**{rc:.2f}×**" if bold else f"{rc:.2f}×") if rc is not None else "—"]) + " |")
    lines.append("")
    lines.append("What each number includes:")
    lines.append("")
    lines.append("- **Both sides run the same trainer loop** (`bench/bench.py`, `child_main`): a Python process "
                 "with torch imported that takes each batch as torch tensors and reads every byte of it "
                 f"({CONSUME_DESC[p['consume']]}, data and labels). DataLoader reads a file with `open(path, 'rb').read()`; token "
                 "windows are 2 bytes a token on both sides (uint16 viewed as int16: torch 1.13 has no uint16). "
                 "DataLoader at 1 or 2 workers runs with `persistent_workers=True` and the prefetch factor shown; "
                 "batch size, shuffle and the number of timed epochs are the same on both sides.")
    lines.append("- **samples/s**: samples of the timed epochs ÷ their wall time, from the end of epoch 0 to the "
                 "last batch consumed; min–max over the runs.")
    lines.append("- **CPU s / 1,000 samples**: user + system CPU over the timed epochs of every process the side "
                 "runs, read at the start and the end of the timed epochs (the threads' run times from "
                 "`/proc/PID/task/*/schedstat`, or `/proc/PID/stat` when threads ended in between; the "
                 "trainer's own from getrusage): "
                 "loaderd = the daemon (all its threads) + the trainer process; DataLoader = the main process + "
                 "its workers. **samples per CPU-second** = 1,000 ÷ that: the per-core comparison (a loader that "
                 "uses two cores to go twice as fast scores the same as one that uses one). "
                 "³ loaderctl's CPU comes from wait4 and covers all its epochs, epoch 0 included.")
    lines.append("- ⁴ **the hand-off alone**: `loaderctl read` without `--touch`, over more timed epochs: the "
                 "daemon fills the ring (its copy of every window) and the client takes each batch and gives it "
                 "back without reading it. It is what the hand-off (announcing, waking, leasing, releasing) costs "
                 "on top of the daemon's copy, so it has no ratio against DataLoader, whose loop reads every byte.")
    lines.append("- **peak RSS / PSS MiB**: the largest sum, polled every "
                 f"{POLL_S * 1000:.0f} ms (PSS every {POLL_S * PSS_EVERY * 1000:.0f} ms), over the processes of "
                 "the side: loaderd = the daemon + the trainer process (with torch and loaderclient loaded); "
                 "DataLoader = the main process + its workers. RSS counts a shared page once per process that maps "
                 "it (torch's libraries in every worker, the ring in daemon and trainer); PSS divides it among "
                 "them. Both include the page-cache pages of a mapped file (the token file: loaderd maps it in "
                 "the daemon, DataLoader in each process).")
    lines.append("- **÷ best DataLoader**: median samples/s ÷ the fastest DataLoader configuration's (by median); "
                 "**per CPU-s**: samples per CPU-second ÷ the DataLoader configuration with the most samples per "
                 "CPU-second.")
    lines.append("")
    for r in rows:
        if r["loader"] == "loaderd" and r["client"] == "python":
            lines.append(f"- {r['dataset']}: loaderd (Python client) {fmt(r['ratio_vs_best_dataloader'], '.2f')}× "
                         f"the best DataLoader (num_workers={r['best_dataloader_workers']}) in samples/s, "
                         f"{fmt(r['per_cpu_ratio_vs_best_dataloader'], '.2f')}× per CPU-second (against "
                         f"num_workers={r['best_per_cpu_dataloader_workers']}); CPU split per 1,000 samples: "
                         + ", ".join(f"{k} {v:.3f} s" for k, v in r["cpu_split_s_per_1000"].items()
                                     if k != "workers") + ".")
    floor = meta.get("floor") or {}
    what = {"records": "open + pread + close of each file", "tokens": "a copy of each window from the mapped file"}
    for ds, f in floor.items():
        line = (f"- {ds} floor (`bench/ld-copyfloor.c`, one core, no loader: {what[ds]}, "
                f"{f['mean_sample_bytes']:,} B a sample): {f['cpu_us_per_sample']:.3f} µs of CPU a sample "
                f"({f['samples_per_cpu_s']:,.0f} a CPU-second)")
        for r in rows:
            if r["dataset"] == ds and r["loader"] == "loaderd" and r.get("cpu_s_per_1000"):
                us = r["cpu_s_per_1000"] * 1000
                line += (f"; loaderd ({client_name(r)}) "
                         f"{us:.2f} µs, {us / f['cpu_us_per_sample']:.1f}× the floor")
        lines.append(line + ".")
    lines += handoff_lines(rows)
    if meta.get("failures"):
        lines.append("")
        lines.append("**FAILURES:**")
        for f in meta["failures"]:
            lines.append(f"- {f}")
    lines.append("")
    return "\n".join(lines)


def console_table(rows):
    hdr = ["dataset", "loader", "workers", "samples/s", "min-max", "CPU s/1k", "smp/CPU-s", "RSS MiB",
           "PSS MiB", "x best DL", "x per CPU"]
    body = []
    for r in rows:
        rt, rc = r.get("ratio_vs_best_dataloader"), r.get("per_cpu_ratio_vs_best_dataloader")
        name = r["loader"] if r["loader"] == "DataLoader" else (
            "loaderd-py" if r["client"] == "python" else "loaderd-C" if r.get("touch", True) else "loaderd-hand-off")
        body.append([r["dataset"], name, str(r["workers"]), fmt(r["samples_per_s"], ",.0f", "-"),
                     f"{r['samples_per_s_min']:,.0f}-{r['samples_per_s_max']:,.0f}",
                     fmt(r["cpu_s_per_1000"], ".3f", "-"), fmt(r["samples_per_cpu_s"], ",.0f", "-"),
                     fmt(r["peak_rss_mib"], ",.0f", "-"), fmt(r["peak_pss_mib"], ",.0f", "-"),
                     f"{rt:.2f}x" if rt is not None else "-", f"{rc:.2f}x" if rc is not None else "-"])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(hdr, widths)))]
    for b in body:
        out.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(out)
