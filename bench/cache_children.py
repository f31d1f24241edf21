"""The cache benchmark's child processes (bench_cache.py runs each as
`bench_cache.py --child-KIND SPEC`, in a process of its own so that its memory is its
own): the "pickle everything into one file" recipe, built and then loaded through a
DataLoader, and the memory bandwidth (a numpy copy). Each prints one line of JSON."""

import json
import os
import pickle
import time

import bench  # bench.py: the file listing it shares with the DataLoader child
import measure  # bench/measure.py: /proc readings

MIB = measure.MIB


def child_epochs(loader, spec):
    """The DataLoader loop of bench.py's child: counts batches, samples and bytes."""
    epochs = []
    for epoch in range(spec["epochs"]):
        samples = nbytes = batches = 0
        t0 = time.perf_counter()
        it = iter(loader)
        first_ms, partial = None, False
        for batch in it:
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1000
            for t in batch:
                t.clone()           # the trainer reads every byte, as in bench.py (--consume copy)
            samples += batch[0].shape[0]
            nbytes += sum(p.element_size() * p.numel() for p in batch)
            batches += 1
            if batches < len(loader) and (samples >= spec["max_samples"]
                                          or time.perf_counter() - t0 >= spec["max_seconds"]):
                partial = True
                break
        secs = time.perf_counter() - t0
        del it
        epochs.append({"epoch": epoch, "samples": samples, "batches": batches, "bytes": nbytes,
                       "seconds": secs, "first_batch_ms": first_ms, "partial": partial,
                       "samples_per_s": samples / secs if secs > 0 else 0.0})
    return epochs


def child_pickle_build(spec):
    """The recipe's first half: read every file once into a list of (bytes, label) and
    pickle the list into one file."""
    root = spec["root"]
    t0 = time.perf_counter()
    files = bench.list_files(root, "*.bin")
    classes = sorted({f.split(os.sep, 1)[0] for f in files if os.sep in f})
    index = {c: i for i, c in enumerate(classes)}
    items = []
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            items.append((f.read(), index.get(rel.split(os.sep, 1)[0], 0) if os.sep in rel else 0))
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    tmp = spec["path"] + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(items, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, spec["path"])
    t_dump = time.perf_counter() - t1
    print(json.dumps({"samples": len(items), "read_s": t_read, "dump_s": t_dump,
                      "file_size": os.path.getsize(spec["path"]),
                      "hwm_kib": measure.read_proc_kib(os.getpid(), "VmHWM")}))
    return 0


def child_pickle_load(spec):
    """The recipe's second half: a Dataset that unpickles the whole file at start and
    serves from memory, through a DataLoader."""
    import warnings
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
    # np.frombuffer over bytes is read-only; the default collate copies it into the batch
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    torch.manual_seed(spec["seed"])

    class PickledDataset(Dataset):
        def __init__(self, path):
            with open(path, "rb") as f:
                self.items = pickle.load(f)

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            data, label = self.items[i]
            return torch.from_numpy(np.frombuffer(data, dtype=np.uint8)), label

    rss_before = measure.read_proc_kib(os.getpid(), "VmRSS")
    t0 = time.perf_counter()
    ds = PickledDataset(spec["path"])
    load_s = time.perf_counter() - t0
    rss_loaded = measure.read_proc_kib(os.getpid(), "VmRSS")
    loader = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True,
                        num_workers=spec["workers"],
                        **({"persistent_workers": True, "prefetch_factor": 4} if spec["workers"] else {}))
    epochs = child_epochs(loader, spec)
    print(json.dumps({"samples_per_epoch": len(ds), "load_s": load_s,
                      "rss_before_load_kib": rss_before, "rss_after_load_kib": rss_loaded,
                      "torch": torch.__version__, "epochs": epochs}))
    return 0


def child_memcpy(spec):
    import numpy as np
    n = spec["mib"] * MIB
    a = np.ones(n, dtype=np.uint8)
    b = np.zeros(n, dtype=np.uint8)     # written once so that its pages exist before timing
    b[:] = 1
    best = None
    times = []
    for _ in range(spec["repeat"]):
        t0 = time.perf_counter()
        np.copyto(b, a)
        dt = time.perf_counter() - t0
        times.append(dt)
        best = dt if best is None else min(best, dt)
    print(json.dumps({"bytes": n, "seconds": times, "best_gb_per_s": n / best / 1e9,
                      "numpy": np.__version__}))
    return 0
