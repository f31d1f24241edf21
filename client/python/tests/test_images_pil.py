"""loaderd's image pipelines against torchvision's rules on PIL, pixel by pixel, on what a
real daemon serves.

The pictures are made here: photograph-like JPEGs (smooth gradients, texture at several
scales, grain, sharp-edged shapes and thin lines) at sizes from 300 to 1600 pixels,
synthetic worst cases (stripes one to six pixels wide, a zone plate) and a PNG. For each
sample the reference is what torchvision computes on the PIL image: RandomResizedCrop's
rectangle by its get_params rule (drawn from loaderd's documented per-sample random
stream, transcribed below), then PIL's crop + antialiased bilinear resize; and Resize +
CenterCrop. The default decode must stay within 2 levels of it (README's promise);
decode.dct_scaling within the bounds README states for it.
"""
import math
import os

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

import support  # noqa: E402

OUT = 64
M64 = (1 << 64) - 1


# ---- loaderd's per-sample random stream (daemon/transform_plugin.h, a versioned ABI) ----

def _mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Prng:
    def __init__(self, seed, epoch, index, step):
        k = _mix(seed ^ 0x6C6F616465726400)
        k = _mix(k ^ epoch)
        k = _mix(k ^ index)
        self.key = _mix(k ^ step)
        self.counter = 0

    def next(self):
        self.counter += 1
        return _mix((self.key + 0x9E3779B97F4A7C15 * self.counter) & M64)

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        m = self.next() * n
        lo = m & M64
        if lo < n:
            t = ((1 << 64) - n) % n
            while lo < t:
                m = self.next() * n
                lo = m & M64
        return m >> 64


def rrc_params(width, height, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, with rng for torch's draws."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform())
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * rng.uniform())
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.below(height - h + 1)
            j = rng.below(width - w + 1)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# ---- pictures ---------------------------------------------------------------------------

def photo(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    t = ((x + y) / (w + h))[..., None]
    c0, c1 = rng.uniform(20, 220, 3), rng.uniform(20, 220, 3)
    img = c0 * (1 - t) + c1 * t
    for cell, amp in ((max(w, h) / 6, 40), (12, 24), (3, 14)):
        gw, gh = int(w / cell) + 2, int(h / cell) + 2
        grid = Image.fromarray(rng.uniform(0, 255, (gh, gw)).astype(np.uint8))
        tex = np.asarray(grid.resize((w, h), Image.BICUBIC), dtype=np.float64) / 255 - 0.5
        img += amp * tex[..., None]
    img += rng.uniform(-4, 4, (h, w, 1))
    pic = Image.fromarray(np.clip(img, 0, 255).round().astype(np.uint8))
    d = ImageDraw.Draw(pic)
    for _ in range(10):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        x1, y1 = x0 + rng.integers(6, w // 3), y0 + rng.integers(6, h // 3)
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(0, 3)
        if kind == 0:
            d.ellipse((x0, y0, x1, y1), fill=col)
        elif kind == 1:
            d.rectangle((x0, y0, x1, y1), fill=col)
        else:
            d.line((x0, y0, rng.integers(0, w), rng.integers(0, h)), fill=col, width=int(rng.integers(1, 4)))
    return pic


def stripes(w, h):
    x = np.arange(w)
    period = 1 + (x // 64) % 6
    r = np.where((x // period) % 2 == 1, 250, 5)
    y = np.arange(h)[:, None]
    g = np.where((y // 37) % 2 == 1, 200, 30) + 0 * x
    b = np.where(((x + y) // 51) % 2 == 1, 240, 10)
    return Image.fromarray(np.stack([np.broadcast_to(r, (h, w)), g, b], axis=-1).astype(np.uint8))


def zone_plate(w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    v = 127.5 + 127.5 * np.cos(((x - w / 2) ** 2 + (y - h / 2) ** 2) * math.pi / (2.0 * max(w, h)))
    return Image.fromarray(np.repeat(v.round().astype(np.uint8)[..., None], 3, axis=-1))


# (file, kind of picture): sorted path order is the dataset's order; one class.
PICTURES = [
    ("p0.jpg", lambda: photo(500, 375, 1), dict(quality=90)),
    ("p1.jpg", lambda: photo(375, 500, 2), dict(quality=75)),
    ("p2.jpg", lambda: photo(1024, 768, 3), dict(quality=95, subsampling=0)),
    ("p3.jpg", lambda: photo(1600, 1200, 4), dict(quality=90)),
    ("p4.png", lambda: photo(400, 300, 5), dict()),
    ("s0.jpg", lambda: stripes(768, 512), dict(quality=90)),
    ("s1.jpg", lambda: zone_plate(640, 480), dict(quality=90)),
]
EPOCHS = 3


@pytest.fixture(scope="module")
def image_daemon():
    d = support.short_tmpdir("lc-pil.")
    folder = os.path.join(d, "img", "all")
    os.makedirs(folder)
    for name, make, opts in PICTURES:
        make().save(os.path.join(folder, name), **opts)
    tail = "      - to_dtype: {dtype: uint8, layout: HWC}\n"
    rrc = "      - random_resized_crop: {size: %d}\n" % OUT
    evl = "      - resize: {size: %d}\n      - center_crop: {size: %d}\n" % (OUT + OUT // 4, OUT)
    ds = ""
    for name, decode in (("", ""), ("_dct", "      - decode: {dct_scaling: true}\n"),
                         ("_fast", "      - decode: {fast: true}\n")):
        ds += "  rrc%s:\n    kind: image_folder\n    path: img\n    transforms:\n%s%s%s" % (name, decode, rrc, tail)
        ds += "  eval%s:\n    kind: image_folder\n    path: img\n    transforms:\n%s%s%s" % (name, decode, evl, tail)
    dm = support.Daemon(d, ds)
    dm.start()
    yield dm, folder
    rc = dm.stop()
    dm.kill()
    support.rmtree(d)
    assert rc == 0


def served(dm, dataset, epoch):
    """Every sample of one unshuffled epoch, in order (index = position)."""
    import loaderclient
    with loaderclient.Client(dm.socket, timeout=30) as c:
        with c.open(dataset, len(PICTURES), shuffle=False, seed=0, epoch=epoch, epochs=1) as s:
            out = [b["image"].copy() for b in s]
    return np.concatenate(out)


def references(folder, epoch):
    """torchvision on PIL: RandomResizedCrop(OUT) and Resize(OUT * 5 / 4) + CenterCrop(OUT)."""
    rrc, ev = [], []
    for index, (name, _, _) in enumerate(PICTURES):
        img = Image.open(os.path.join(folder, name)).convert("RGB")
        w, h = img.size
        i, j, ch, cw = rrc_params(w, h, Prng(0, epoch, index, 0))
        rrc.append(np.asarray(img.crop((j, i, j + cw, i + ch)).resize((OUT, OUT), Image.BILINEAR)))
        s = OUT + OUT // 4
        size = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
        r = img.resize(size, Image.BILINEAR)
        top, left = int(round((size[1] - OUT) / 2.0)), int(round((size[0] - OUT) / 2.0))
        ev.append(np.asarray(r.crop((left, top, left + OUT, top + OUT))))
    return np.stack(rrc), np.stack(ev)


def diff(got, want):
    d = np.abs(got.astype(np.int16) - want.astype(np.int16))
    return int(d.max()), float(d.mean())


def test_default_decode_gives_pils_pixels(image_daemon):
    dm, folder = image_daemon
    for epoch in range(EPOCHS):
        ref_rrc, ref_eval = references(folder, epoch)
        got_rrc = served(dm, "rrc", epoch)
        for k, (name, _, _) in enumerate(PICTURES):
            mx, mean = diff(got_rrc[k], ref_rrc[k])
            assert mx <= 2 and mean <= 0.3, "%s epoch %d, RandomResizedCrop: max %d, mean %.3f" % (name, epoch, mx, mean)
        if epoch == 0:
            got_eval = served(dm, "eval", 0)
            for k, (name, _, _) in enumerate(PICTURES):
                mx, mean = diff(got_eval[k], ref_eval[k])
                assert mx <= 2 and mean <= 0.3, "%s, Resize + CenterCrop: max %d, mean %.3f" % (name, mx, mean)


def test_dct_scaling_within_stated_bounds(image_daemon):
    dm, folder = image_daemon
    worst, means = 0, []
    for epoch in range(EPOCHS):
        ref_rrc, _ = references(folder, epoch)
        got = served(dm, "rrc_dct", epoch)
        for k in range(len(PICTURES)):
            mx, mean = diff(got[k], ref_rrc[k])
            worst = max(worst, mx)
            means.append(mean)
    _, ref_eval = references(folder, 0)
    mx, mean = diff(served(dm, "eval_dct", 0), ref_eval)
    worst = max(worst, mx)
    means.append(mean)
    # README, per crop: photographs within 14 levels (mean <= 0.4), stripes one to six
    # pixels wide within 22 (mean <= 3.2); some slack for pictures other than the ones
    # measured there.
    assert worst <= 32 and max(means) <= 4.0, (worst, max(means))


def test_fast_decode_within_stated_bounds(image_daemon):
    dm, folder = image_daemon
    worst, means = 0, []
    for epoch in range(EPOCHS):
        ref_rrc, ref_eval = references(folder, epoch)
        got = served(dm, "rrc_fast", epoch)
        for k in range(len(PICTURES)):
            mx, mean = diff(got[k], ref_rrc[k])
            worst, means = max(worst, mx), means + [mean]
    got = served(dm, "eval_fast", 0)
    for k in range(len(PICTURES)):
        mx, mean = diff(got[k], ref_eval[k])
        worst, means = max(worst, mx), means + [mean]
    # README: up to 60 levels at colour edges, mean about 1 (up to 2.7 on fine stripes).
    assert worst <= 80 and max(means) <= 3.5, (worst, max(means))
