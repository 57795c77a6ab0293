"""Command line: python -m pybridge.recordio (or pybridge-recordio) pack | cat | inspect | verify.

Exit status: 0 success, 1 a file is missing or corrupt (the message names the file, the
chunk and its byte offset), 2 bad usage.
"""

import argparse
import os
import sys

from .._version import __version__
from ..errors import CorruptData, PyBridgeError
from ..base.progress import progress
from .format import COMPRESSORS, DEFAULT_MAX_CHUNK_BYTES
from .reader import Reader
from .writer import Writer

PROG = "pybridge-recordio"


def _input_records(paths, lines):
    """Records from the inputs: each file is one record, or with --lines each of its lines;
    no inputs (or '-') means the lines of standard input."""
    if not paths:
        paths = ["-"]
    for path in paths:
        if path == "-":
            for line in sys.stdin.buffer:
                yield line[:-1] if line.endswith(b"\n") else line
        elif lines:
            with open(path, "rb") as f:
                for line in f:
                    yield line[:-1] if line.endswith(b"\n") else line
        else:
            with open(path, "rb") as f:
                yield f.read()


def cmd_pack(args, out):
    if args.records < 1:
        print(f"{PROG} pack: --records must be at least 1", file=sys.stderr)
        return 2
    shard, writer, written = 0, None, []
    folder = os.path.dirname(args.output)
    if folder:
        os.makedirs(folder, exist_ok=True)
    bar = progress(desc=f"{PROG} pack", unit="records")  # shown on a terminal only
    try:
        for record in _input_records(args.inputs, args.lines):
            if writer is None or writer.records_written >= args.records:
                if writer is not None:
                    writer.close()
                path = f"{args.output}-{shard:05d}.recordio"
                writer = Writer(path, args.compressor, args.max_chunk_bytes)
                written.append(writer)
                shard += 1
            writer.write(record)
            bar.update()
        if writer is not None:
            writer.close()
    except OSError as exc:  # an input that cannot be read or a shard that cannot be written
        raise PyBridgeError(f"pack failed: {exc}") from exc
    finally:
        bar.close()
        if writer is not None and not writer.closed:
            writer.close()
    if not written:  # never leave an empty (unreadable) shard behind
        print("no input records; nothing written", file=sys.stderr)
        return 0
    for w in written:
        print(f"{w.path}\t{w.records_written} records\t{w.chunks_written} chunks", file=out)
    return 0


def _render(record, fmt):
    if fmt == "raw":
        return record + b"\n"
    if fmt == "hex":
        return record.hex().encode() + b"\n"
    return repr(record).encode() + b"\n"


def cmd_cat(args, out):
    for path in args.files:
        with Reader(path, skip_corrupt=args.skip_corrupt) as r:
            start = min(args.start, r.num_records)
            count = r.num_records - start if args.count is None else min(args.count, r.num_records - start)
            for batch in r.batches(1024, start, count):
                text = b"".join(_render(rec, args.format) for rec in batch.tolist())
                if hasattr(out, "buffer"):
                    out.flush()
                    out.buffer.write(text)
                else:  # a text-only stream (e.g. io.StringIO in tests)
                    out.write(text.decode("utf-8", "backslashreplace"))
            for err in r.corrupt_errors:
                print(f"skipped: {err}", file=sys.stderr)
    return 0


def cmd_inspect(args, out):
    for path in args.files:
        with Reader(path, skip_corrupt=args.skip_corrupt, allow_empty=True) as r:
            chunks = r.chunks
            kinds = sorted({c.compressor_name for c in chunks})
            print(f"{path}: {os.path.getsize(path)} bytes, {r.num_chunks} chunks, {r.num_records} records, "
                  f"compressor {', '.join(kinds) or '-'}", file=out)
            if not args.summary:
                print("  chunk      offset  compressor  payload_bytes    records  first_record  checksum",
                      file=out)
                for c in chunks:
                    print(f"  {c.ordinal:5d} {c.offset:11d}  {c.compressor_name:10s} {c.size:14d} "
                          f"{c.num_records:10d} {c.first_record:13d}  0x{c.checksum:08x}", file=out)
            for err in r.corrupt_errors:
                print(f"  corrupt: {err}", file=out)
    return 0


def cmd_verify(args, out):
    bad = 0
    for path in args.files:
        try:
            with Reader(path, skip_corrupt=True) as r:
                problems = r.verify()
                if problems:
                    bad += 1
                    for err in problems:
                        print(f"CORRUPT {err}", file=out)
                else:
                    print(f"ok {path}: {r.num_chunks} chunks, {r.num_records} records", file=out)
        except PyBridgeError as exc:  # missing, empty, unreadable
            bad += 1
            print(f"{'CORRUPT' if isinstance(exc, CorruptData) else 'ERROR'} {exc}", file=out)
    return 1 if bad else 0


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description="Pack, inspect and verify RecordIO files "
                                "(the format of the Go library GoTorch used).")
    sub = p.add_subparsers(dest="command", required=True)

    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    pk = sub.add_parser("pack", help="pack files or input lines into RecordIO shards")
    pk.add_argument("inputs", nargs="*", help="files, each one record (or '-'/none: stdin lines)")
    pk.add_argument("-o", "--output", required=True, help="output prefix: PREFIX-00000.recordio, ...")
    pk.add_argument("-n", "--records", type=int, default=10000, help="records per shard (default 10000)")
    pk.add_argument("-c", "--compressor", choices=sorted(COMPRESSORS), default="snappy")
    pk.add_argument("--max-chunk-bytes", type=int, default=DEFAULT_MAX_CHUNK_BYTES,
                    help=f"raw record bytes per chunk (default {DEFAULT_MAX_CHUNK_BYTES})")
    pk.add_argument("--lines", action="store_true", help="each line of each input file is a record")
    pk.set_defaults(run=cmd_pack)

    ct = sub.add_parser("cat", help="print records")
    ct.add_argument("files", nargs="+")
    ct.add_argument("--start", type=int, default=0)
    ct.add_argument("--count", type=int, default=None)
    ct.add_argument("--format", choices=("raw", "hex", "repr"), default="raw",
                    help="raw: bytes then newline; hex; repr (default raw)")
    ct.add_argument("--skip-corrupt", action="store_true")
    ct.set_defaults(run=cmd_cat)

    ins = sub.add_parser("inspect", help="list chunks, records and compressors")
    ins.add_argument("files", nargs="+")
    ins.add_argument("--summary", action="store_true", help="one line per file, no chunk table")
    ins.add_argument("--skip-corrupt", action="store_true")
    ins.set_defaults(run=cmd_inspect)

    vf = sub.add_parser("verify", help="check every chunk's checksum and records; exit 1 if any is bad")
    vf.add_argument("files", nargs="+")
    vf.set_defaults(run=cmd_verify)
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if getattr(args, "start", 0) < 0 or (getattr(args, "count", None) or 0) < 0:
        print(f"{PROG}: --start and --count must not be negative", file=sys.stderr)
        return 2
    try:
        return args.run(args, sys.stdout)
    except PyBridgeError as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `cat | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

