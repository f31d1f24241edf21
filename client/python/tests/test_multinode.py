"""Several nodes, simulated on one machine: three loaderd daemons (one per "node", each
with its own socket, config and cache) over one dataset, two trainer ranks on each,
world size 6, all six reading at once. No daemon knows of the others: each rank opens its
(rank, world_size) part of the global permutation on its own node's daemon. Per epoch
the six parts cover the dataset exactly once, every rank gets the same number of batches,
and a rank's part does not depend on which daemon serves it (docs/multi-node.md)."""
import os
import threading

import support
import loaderclient

N, SIZE, CLASSES = 600, 64, 4
NODES, PER_NODE = 3, 2
WORLD = NODES * PER_NODE


def _index(blob):
    """The file's index from its first 8 bytes (support.file_bytes)."""
    return _WORD0[int.from_bytes(blob[:8], "little")]


_WORD0 = {support.file_word0(i): i for i in range(N)}


def _read_rank(sock, rank, out, errors, epochs=2, batch=8, n=N):
    try:
        with loaderclient.Client(sock, timeout=20, name="rank%d" % rank) as c:
            with c.open("shared", batch, seed=17, epochs=epochs, rank=rank, world_size=WORLD) as s:
                per_epoch = {}
                for b in s:
                    e = per_epoch.setdefault(b.epoch, {"batches": 0, "samples": []})
                    e["batches"] += 1
                    for r in range(b.rows):
                        blob = bytes(b["data"][r])
                        i = _index(blob)
                        assert blob == support.file_bytes(i, SIZE).tobytes()
                        assert b["label"][r] == i % CLASSES
                        e["samples"].append(i)
        out[rank] = per_epoch
    except BaseException as e:   # reported by the main thread
        errors.append((rank, e))


def test_three_daemons_two_ranks_each_cover_exactly():
    root = support.short_tmpdir("lc-nodes.")
    data = os.path.join(root, "data")
    support.gen_files(data, N, SIZE, CLASSES)
    nodes = []
    try:
        for k in range(NODES):
            d = os.path.join(root, "node%d" % k)
            os.mkdir(d)
            nodes.append(support.Daemon(d, "  shared:\n    kind: files\n    path: %s\n    cache: {path: shared.ldc}\n"
                                        % data).start())
        out, errors, threads = {}, [], []
        for rank in range(WORLD):
            sock = nodes[rank // PER_NODE].socket   # ranks 0,1 on node 0; 2,3 on node 1; ...
            threads.append(threading.Thread(target=_read_rank, args=(sock, rank, out, errors)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for epoch in range(2):
            counts = {out[r][epoch]["batches"] for r in range(WORLD)}
            assert counts == {-(-N // WORLD // 8)}, counts          # equal batch counts: ceil(100 / 8)
            union = sorted(i for r in range(WORLD) for i in out[r][epoch]["samples"])
            assert union == list(range(N))                         # exactly once across the nodes
        assert out[0][0]["samples"] != out[0][1]["samples"]        # the epoch advances by itself
        # Rank 5's part served by node 0 instead of node 2: the same samples in the same order.
        again, errors = {}, []
        _read_rank(nodes[0].socket, 5, again, errors, epochs=1)
        assert not errors, errors
        assert again[5][0]["samples"] == out[5][0]["samples"]
        for dm in nodes:
            dm.stop_clean()
    finally:
        for dm in nodes:
            dm.kill()
        support.rmtree(root)


def test_kubernetes_example_agrees_with_itself():
    """contrib/kubernetes: the daemon's socket and /dev/shm are the trainer's, the config
    in the ConfigMap names that socket, and its dataset is the files kind at an s3://
    location with a node-local cache on the host path."""
    yaml = __import__("pytest").importorskip("yaml")
    kdir = os.path.join(support.REPO, "contrib", "kubernetes")
    with open(os.path.join(kdir, "loaderd-daemonset.yaml")) as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f)}
    with open(os.path.join(kdir, "trainer-pod.yaml")) as f:
        pod = yaml.safe_load(f)
    cfg = yaml.safe_load(docs["ConfigMap"]["data"]["loaderd.yaml"])
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    tmounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    thost = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    sock = cfg["server"]["socket"]
    assert os.path.dirname(sock) == mounts["socket"] == tmounts["socket"] and host["socket"] == thost["socket"]
    assert mounts["shm"] == tmounts["shm"] == host["shm"] == thost["shm"] == "/dev/shm"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["LOADERD_SOCKET"] == sock
    assert pod["spec"]["securityContext"]["runAsUser"] == spec["containers"][0]["securityContext"]["runAsUser"]
    ds = cfg["datasets"]["train"]
    assert ds["kind"] == "files" and ds["path"].startswith("s3://")
    assert os.path.dirname(ds["cache"]["path"]) == mounts["cache"]
