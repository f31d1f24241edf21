"""The cache benchmark's report (bench_cache.py): the ratios it is judged by, the markdown
of bench/results/cache.md and the console summary, from the results and the run's
parameters (meta["params"])."""

import measure  # bench/measure.py: reporting helpers

MIB = measure.MIB
fmt = measure.fmt
ratio = measure.ratio


def summarize(res):
    """The ratios the issue asks for."""
    s = {}
    rec, large = res.get("warm", {}).get("records"), res.get("warm", {}).get("large")
    t = res.get("torch") or {}
    if rec:
        c = rec["cached"]["samples_per_s"]
        s["cached_vs_loaderd_files"] = ratio(c, rec["files"]["samples_per_s"])
        best_dl = max((r["samples_per_s"] for r in t.get("files", [])), default=None)
        best_pk = max((r["samples_per_s"] for r in t.get("pickle", [])), default=None)
        s["cached_vs_dataloader_files_best"] = ratio(c, best_dl)
        s["cached_vs_pickle_best"] = ratio(c, best_pk)
        s["target_10x_met"] = (s["cached_vs_loaderd_files"] or 0) >= 10
    if large and res.get("memcpy"):
        bw = res["memcpy"]["best_gb_per_s"] * 1000       # MB/s
        s["large_cached_fraction_of_memcpy"] = ratio(large["cached"]["mb_per_s"], bw)
        s["large_files_fraction_of_memcpy"] = ratio(large["files"]["mb_per_s"], bw)
        s["target_2x_memcpy_met"] = (s["large_cached_fraction_of_memcpy"] or 0) >= 0.5
    cold = res.get("cold") or {}
    if cold.get("cache") and cold.get("files"):
        s["cold_cached_vs_files"] = ratio(cold["cache"]["samples_per_s"], cold["files"]["samples_per_s"])
    return s


def steady_desc(n):
    """Which epochs of a DataLoader run of n epochs are measured: all but epoch 0."""
    return "epoch 0 of 1" if n == 1 else "epoch 1 of 2" if n == 2 else f"epochs 1–{n - 1} of {n}"


def epochs_desc(eps):
    return f"epoch {eps[0]}" if len(eps) == 1 else f"epochs {eps[0]}–{eps[-1]}"


def main_rows(res, p):
    """(source, loader, workers, samples/s, MB/s, peak RSS, note) for the records table."""
    rows = []
    rec = res.get("warm", {}).get("records")
    t = res.get("torch") or {}
    if rec:
        c = rec["cached"]
        rows.append(["cache", "loaderd", f"{p['daemon_workers']} threads", c["samples_per_s"], c["mb_per_s"],
                     c["peak_rss_mib"], f"stream 2, {epochs_desc(c['epochs'])} (steady)"])
        f = rec["files"]
        rows.append(["files", "loaderd", f"{p['daemon_workers']} threads", f["samples_per_s"], f["mb_per_s"],
                     f["peak_rss_mib"], f"no cache, {epochs_desc(f['epochs'])} (steady)"])
        e = rec["epoch0"]
        rows.append(["files, cache building", "loaderd", f"{p['daemon_workers']} threads", e["samples_per_s"],
                     e["mb_per_s"], e["peak_rss_mib"], "epoch 0 of the cached dataset"])
    for r in t.get("files", []):
        rows.append(["files", "DataLoader", str(r["workers"]), r["samples_per_s"], r["mb_per_s"],
                     r["peak_rss_mib"], steady_desc(len(r["runs"][0]["child"]["epochs"]))
                     + " (bench.py's trainer: open().read() per file; packed vs files, not like for like)"])
    for r in t.get("pickle", []):
        rows.append(["pickle, in memory", "DataLoader", str(r["workers"]), r["samples_per_s"], r["mb_per_s"],
                     r["peak_rss_mib"], f"{steady_desc(len(r['child']['epochs']))}, after a {r['load_s']:.2f} s load"
                     + (" (partial)" if r["partial"] else "")])
    c = rec["cached"]["samples_per_s"] if rec else None
    for row in rows:
        row.append(ratio(c, row[3]))
    return rows


def render(res, meta):
    L = []
    m = meta["machine"]
    p = meta["params"]
    s = res["summary"]
    L.append(f"# loaderd dataset cache — {m['date']}")
    L.append("")
    L.append(f"Machine: {m['nproc']} CPUs usable ({m['cpu_model']}), {m['mem_total_mib']} MiB RAM, "
             f"Linux {m['kernel']}; Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}.")
    L.append(f"Command: `{meta['command']}` (`make bench` runs it after bench.py).")
    L.append(f"Data{' (--quick)' if p['quick'] else ''}: records = {p['files']:,} files × {p['file_size']} B "
             f"in {p['classes']} classes, batch {p['records_batch']}; large = {p['large_files']:,} files × "
             f"{p['large_size']:,} B, batch {p['large_batch']}. Shuffle on; loaderd with {p['daemon_workers']} worker "
             "threads, cache mode auto (cache file removed before the run). Page cache warm unless "
             "marked cold.")
    L.append("")
    rec = res.get("warm", {}).get("records")
    L.append(f"## Records ({p['files']:,} × {p['file_size']} B): cached epochs against the files")
    L.append("")
    L.append("| source | loader | workers | samples/s | MB/s | peak RSS MiB | measured | cached ÷ this |")
    L.append("|---|---|---:|---:|---:|---:|---|---:|")
    for r in main_rows(res, p):
        L.append(f"| {r[0]} | {r[1]} | {r[2]} | {fmt(r[3], ',.0f')} | {fmt(r[4], ',.1f')} | "
                 f"{fmt(r[5], ',.0f')} | {r[6]} | {fmt(r[7], '.2f')}× |")
    L.append("")
    if rec:
        L.append(f"- **cached ÷ loaderd files (same {p['daemon_workers']} workers): "
                 f"{fmt(s.get('cached_vs_loaderd_files'), '.2f')}×** (target ≥ 10×: "
                 f"{'met' if s.get('target_10x_met') else 'not met'}).")
        L.append(f"- **Against PyTorch, like for like: ÷ the best pickle-everything recipe "
                 f"{fmt(s.get('cached_vs_pickle_best'), '.2f')}×** — both read one packed file held in memory. "
                 f"÷ the best DataLoader over the files: {fmt(s.get('cached_vs_dataloader_files_best'), '.2f')}× "
                 "is not like for like: it sets an in-memory packed file against a DataLoader that opens a "
                 "file per sample, so it measures the packing as much as the loader.")
        b = rec["build"]
        L.append(f"- Cache build: {fmt(b['seconds'], '.2f')} s (header build time to ready, polled every "
                 f"{p['poll_build_s'] * 1000:.0f} ms after epoch 0; ready {b['ready_after_epoch0_s']:.2f} s after "
                 f"epoch 0 ended), file {b['file_size']:,} bytes ({b['file_size'] / MIB:,.1f} MiB) for "
                 f"{b['count']:,} samples.")
        cf = rec["cached"]["stream_first_epoch"]
        L.append(f"- The cached stream's own first epoch (epoch 1, stream start-up included): "
                 f"{cf['samples_per_s']:,.0f} samples/s; the files stream's: "
                 f"{rec['files']['stream_first_epoch']['samples_per_s']:,.0f}. Peak RSS of loaderd rows = "
                 "daemon VmHWM over the read + loaderctl's; a cached read's includes the cache file's "
                 "pages the daemon has mapped (page cache, shared).")
    pb = (res.get("torch") or {}).get("pickle_build")
    if pb:
        L.append(f"- Pickle recipe: reading the {pb['samples']:,} files {pb['read_s']:.2f} s, pickling "
                 f"{pb['dump_s']:.2f} s, file {pb['file_size'] / MIB:,.0f} MiB, builder peak RSS "
                 f"{pb['peak_rss_mib']:,.0f} MiB; loading: "
                 + ", ".join(f"{r['load_s']:.2f} s (+{r['load_rss_mib']:,.0f} MiB RSS) at num_workers={r['workers']}"
                             for r in res["torch"]["pickle"])
                 + "; peak PSS of the process tree (shared pages divided among its processes): "
                 + ", ".join(f"{r['peak_pss_mib']:,.0f} MiB at num_workers={r['workers']}"
                             for r in res["torch"]["pickle"])
                 + " (forked workers touch the list's objects, so copy-on-write duplicates them).")
    L.append("")
    cold = res.get("cold") or {}
    L.append("## Cold page cache (records, one epoch each, right after `echo 3 > /proc/sys/vm/drop_caches`)")
    L.append("")
    if not cold.get("measured"):
        L.append(f"cold: not measured ({cold.get('reason', 'skipped')}).")
    elif cold.get("cache") and cold.get("files"):
        L.append("| source | samples/s | MB/s | epoch s | first batch ms |")
        L.append("|---|---:|---:|---:|---:|")
        for k in ("cache", "files"):
            c = cold[k]
            L.append(f"| {k} | {c['samples_per_s']:,.0f} | {c['mb_per_s']:,.1f} | {c['seconds']:.2f} | "
                     f"{fmt(c['first_batch_ms'], ',.1f')} |")
        L.append("")
        L.append(f"Cold cached ÷ cold files: **{fmt(s.get('cold_cached_vs_files'), '.2f')}×**. A fresh daemon "
                 "(its start-up scan not timed); the cached stream's open also re-checks the source's "
                 "fingerprint (a stat per file, cold) in the background while it reads, and reads the "
                 "files until that check has passed: "
                 f"{cold['cache'].get('cache_hits', 0):,} of the epoch's samples came from the cache.")
    else:
        L.append("cold: failed (see FAILURES).")
    L.append("")
    large = res.get("warm", {}).get("large")
    L.append(f"## Large samples ({p['large_files']:,} × {p['large_size']:,} B) and memory bandwidth")
    L.append("")
    mc = res.get("memcpy")
    bw = mc["best_gb_per_s"] * 1000 if mc else None
    if mc:
        L.append(f"Memory bandwidth: numpy copy of {p['memcpy_mib']} MiB, best of {p['memcpy_repeat']}: "
                 f"**{mc['best_gb_per_s']:.2f} GB/s** (bytes copied per second, **one thread**).")
        L.append("")
    if large:
        L.append("| source | samples/s | MB/s | fraction of memcpy | measured |")
        L.append("|---|---:|---:|---:|---|")
        for k, src, note in (("cached", "cache", None), ("files", "files", None)):
            c = large[k]
            L.append(f"| {src} | {c['samples_per_s']:,.0f} | {c['mb_per_s']:,.0f} | "
                     f"{fmt(ratio(c['mb_per_s'], bw), '.2f')} | {epochs_desc(c['epochs'])} (steady) |")
        e = large["epoch0"]
        L.append(f"| files, cache building | {e['samples_per_s']:,.0f} | {e['mb_per_s']:,.0f} | "
                 f"{fmt(ratio(e['mb_per_s'], bw), '.2f')} | epoch 0 |")
        L.append("")
        L.append(f"Cached MB/s ÷ memcpy: **{fmt(s.get('large_cached_fraction_of_memcpy'), '.2f')}** "
                 f"(target ≥ 0.5, within 2×: {'met' if s.get('target_2x_memcpy_met') else 'not met'}). "
                 f"This sets loaderd's {p['daemon_workers']} worker threads copying against a one-thread copy: "
                 "a figure above 1 means two threads together beat one, not that loaderd beats memcpy. "
                 f"Cache build {fmt(large['build']['seconds'], '.2f')} s, file "
                 f"{large['build']['file_size'] / MIB:,.0f} MiB. loaderctl maps each batch and releases "
                 "it without reading it; the daemon copies every byte from the cache mapping into the "
                 "ring slot, which is the copy compared with numpy's.")
        L.append("")
    L.append("## Per epoch (loaderd)")
    L.append("")
    for name in ("records", "large"):
        d = res.get("warm", {}).get(name)
        if not d:
            continue
        L.append(f"{name}: epoch 0 served from the files while the cache builds (stream 1), epochs 1.. "
                 f"from the cache (stream 2); the no-cache stream alongside.")
        L.append("")
        L.append("| epoch | source | samples/s | MB/s | | no-cache epoch | samples/s | MB/s |")
        L.append("|---:|---|---:|---:|---|---:|---:|---:|")
        left = [d["epoch0"]] + d["cached_epochs"]
        right = d["files_epochs"]
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else None
            b = right[i] if i < len(right) else None
            L.append("| " + " | ".join([
                str(a["epoch"]) if a else "", a["source"] if a else "",
                fmt(a and a["samples_per_s"], ",.0f", ""), fmt(a and a["mb_per_s"], ",.1f", ""), "",
                str(b["epoch"]) if b else "", fmt(b and b["samples_per_s"], ",.0f", ""),
                fmt(b and b["mb_per_s"], ",.1f", "")]) + " |")
        L.append("")
    if meta.get("failures"):
        L.append("**FAILURES:**")
        for f in meta["failures"]:
            L.append(f"- {f}")
        L.append("")
    return "\n".join(L)


def console(res, p):
    rows = main_rows(res, p)
    hdr = ["source", "loader", "workers", "samples/s", "MB/s", "peak RSS MiB", "cached/this"]
    body = [[r[0], r[1], r[2], fmt(r[3], ",.0f"), fmt(r[4], ",.1f"), fmt(r[5], ",.0f"),
             fmt(r[7], ".2f", "-") + "x"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(hdr, widths)))]
    for b in body:
        out.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    s = res["summary"]
    rec = res.get("warm", {}).get("records")
    if rec:
        out.append(f"records: cached / loaderd files = {fmt(s.get('cached_vs_loaderd_files'), '.2f')}x "
                   f"(target 10x), / pickle recipe best (like for like) = "
                   f"{fmt(s.get('cached_vs_pickle_best'), '.2f', '-')}x, / DataLoader over the files best (packed "
                   f"vs files, not like for like) = {fmt(s.get('cached_vs_dataloader_files_best'), '.2f', '-')}x; "
                   f"cache built in "
                   f"{fmt(rec['build']['seconds'], '.2f')} s, {rec['build']['file_size'] / MIB:,.1f} MiB")
    cold = res.get("cold") or {}
    if not cold.get("measured"):
        out.append(f"cold: not measured ({cold.get('reason', 'skipped')})")
    elif cold.get("cache") and cold.get("files"):
        out.append(f"cold: cache {cold['cache']['samples_per_s']:,.0f} samples/s, files "
                   f"{cold['files']['samples_per_s']:,.0f} samples/s = {fmt(s.get('cold_cached_vs_files'), '.2f')}x")
    large = res.get("warm", {}).get("large")
    if large and res.get("memcpy"):
        out.append(f"large: cached {large['cached']['mb_per_s']:,.0f} MB/s, files {large['files']['mb_per_s']:,.0f} "
                   f"MB/s; memcpy {res['memcpy']['best_gb_per_s']:.2f} GB/s; cached / memcpy = "
                   f"{fmt(s.get('large_cached_fraction_of_memcpy'), '.2f')} (target >= 0.5; "
                   f"{p['daemon_workers']} loaderd threads vs a one-thread copy)")
    return "\n".join(out)
