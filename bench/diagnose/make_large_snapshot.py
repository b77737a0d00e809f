#!/usr/bin/python3
"""Write a large synthetic memory snapshot (>= 10^6 trace events) for the
diagnose benchmark. Not committed: run.sh writes it to a temporary folder.

Usage: make_large_snapshot.py OUT.pickle [EVENTS] [--segments N] [--sites N]
                              [--depth N] [--fresh-stacks] [--vary]
                              [--fragmented] [--fresh-compile-context]
                              [--empty-cache]
       make_large_snapshot.py OUT.pickle [EVENTS] --real

Shape (PyTorch 2.5+ layout, pickle protocol 4, like _dump_snapshot): large
segments of 64 MiB (64 by default) created in the first iteration; every
iteration allocates one tensor per segment from the model's forward and
frees them all (alloc + free_requested + free_completed per tensor); one
oom at the end. By default the stacks are shared: 8 model sites of 6 frames,
each stack one list object, so pickle memoizes it and every event refers to
it (~79 bytes an event: 10^6 events ~ 79 MB, 14*10^6 ~ 1.1 GB).

Options (what makes real long-job snapshots big):
  --segments N    N segments (and N allocations per iteration); default 64
  --sites N       N distinct model call sites (stacks); default 8
  --depth N       frames per stack, >= 6; the extra frames are trainer
                  frames outside the model (site-packages); default 6
  --fresh-stacks  every event gets its own frames list, as py_symbolize
                  writes them (one list per captured traceback, the frame
                  dicts shared): the alloc and its segment_alloc share one
                  list, the free_requested and free_completed another
  --vary          request sizes differ per iteration (16 MiB + 512 B * k,
                  k = (segment + iteration) % 97) instead of per segment
  --fragmented    end with a 16 MiB tensor kept at the start of every
                  segment and a 60 MiB request refused with the device
                  full: an out-of-memory by fragmentation (48 MiB free in
                  each segment), so diagnose replays the trace under the
                  allocator settings (Note [Allocator settings replayed])
  --fresh-compile-context
                  every event's compile_context is a str of its own, as
                  PyTorch 2.11's _snapshot() makes one per trace entry (the
                  H200 recordings in tests/fixtures/snapshots/h200_recorded/
                  hold SHORT_BINUNICODE 'N/A' + MEMOIZE in each event; their
                  user_metadata '' is CPython's one empty string, a BINGET)
  --empty-cache   torch.cuda.empty_cache() after every iteration: each
                  segment is freed (segment_free) at the start of the next
                  iteration and made again (segment_alloc) before its
                  tensor, so the trace holds 2 segment events per tensor
                  beside the dumped segments (a replay that looked each
                  one up by a scan of the dump was quadratic)
  --real          = --segments 512 --sites 256 --depth 24 --fresh-stacks
                  --vary --fresh-compile-context: ~116 bytes an event,
                  10^7 events ~ 1.16 GB (before 2026-12-07 --real had no
                  --fresh-compile-context: ~109 bytes an event)

The pickle is written as a stream (StreamPickler below): opcode for opcode
what pickle.dump(snapshot, f, protocol=4) writes for the same objects (the
same memo numbering by object identity, APPENDS / SETITEMS batches of 1000,
FRAMEs of ~64 KiB), but events are made one at a time and dropped once
written, so Python's memory stays ~15 MB however many events are written
(pickle.dump of the whole 14*10^6-event snapshot built in memory needed
5.6 GB; this writer: 14 MB, ~8 s per 10^6 events).
`make_large_snapshot.py --self-test` checks that claim against pickle.dumps.
"""

import argparse
import io
import pickle
import struct
import sys

MIB = 1 << 20
TORCH = "/usr/lib/python3/dist-packages/torch"
TRAINER = "/home/user/.venv/lib/python3.11/site-packages/lightning/pytorch"

# Opcodes (CPython Lib/pickle.py).
PROTO, STOP, FRAME, MEMOIZE = b"\x80", b".", b"\x95", b"\x94"
MARK, APPEND, APPENDS, SETITEM, SETITEMS = b"(", b"a", b"e", b"s", b"u"
EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, TUPLE = b"}", b"]", b")", b"t"
TUPLE_N = (None, b"\x85", b"\x86", b"\x87")
NONE, NEWTRUE, NEWFALSE = b"N", b"\x88", b"\x89"
BININT1, BININT2, BININT, LONG1, BINFLOAT = b"K", b"M", b"J", b"\x8a", b"G"
SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 = b"\x8c", b"X", b"\x8d"
BINGET, LONG_BINGET, POP, POP_MARK = b"h", b"j", b"0", b"1"
KEPT = 16 * MIB           # --fragmented: the tensor kept in each segment
FRAME_TARGET = 64 * 1024  # pickle._Framer._FRAME_SIZE_TARGET
BATCH = 1000              # pickle._Pickler._BATCHSIZE


class StreamPickler:
    """Protocol-4 pickle writer for dicts, lists, tuples, str, int, float,
    bool and None, memoizing by identity as pickle.Pickler does. forget(obj)
    drops a written object from the memo (its memo index stays used), so a
    caller can stream a long list without keeping its items alive."""

    def __init__(self, f):
        self.f = f
        self.buf = bytearray()
        self.memo = {}   # id(obj) -> (obj, the bytes that fetch it)
        self.count = 0   # memo entries made (the next MEMOIZE's index)

    def _commit(self, force=False):
        n = len(self.buf)
        if n >= FRAME_TARGET or (force and n):
            if n >= 4:  # pickle._Framer._FRAME_SIZE_MIN
                self.f.write(FRAME + struct.pack("<Q", n))
            self.f.write(self.buf)
            self.buf = bytearray()

    def _memoize(self, obj):
        i = self.count
        self.count += 1
        self.buf += MEMOIZE
        get = BINGET + bytes((i,)) if i < 256 else LONG_BINGET + struct.pack("<I", i)
        self.memo[id(obj)] = (obj, get)

    def forget(self, obj):
        self.memo.pop(id(obj), None)

    def begin(self):
        self.buf += PROTO + b"\x04"

    def end(self):
        self.buf += STOP
        self._commit(force=True)

    def save(self, obj):
        hit = self.memo.get(id(obj))  # only live, memoized objects are in it
        if hit is not None:
            self.buf += hit[1]
            return
        t = type(obj)
        if t is int:
            self.buf += self.int_bytes(obj)
        elif t is str:
            data = obj.encode("utf-8", "surrogatepass")
            n = len(data)
            if n < 256:
                self.buf += SHORT_BINUNICODE + bytes((n,)) + data
            elif n > 0xFFFFFFFF:
                self.buf += BINUNICODE8 + struct.pack("<Q", n) + data
            else:
                self.buf += BINUNICODE + struct.pack("<I", n) + data
            self._memoize(obj)
        elif t is dict:
            # As the C pickler (batch_dict_exact): one item alone takes
            # SETITEM, otherwise every batch of up to 1000, even a last one
            # of a single item, is MARK ... SETITEMS. Lists alike.
            self._commit()
            self.buf += EMPTY_DICT
            self._memoize(obj)
            items = list(obj.items())
            save = self.save
            if len(items) == 1:
                save(items[0][0])
                save(items[0][1])
                self.buf += SETITEM
                return
            for start in range(0, len(items), BATCH):
                self.buf += MARK
                for k, v in items[start:start + BATCH]:
                    save(k)
                    save(v)
                self.buf += SETITEMS
        elif t is list:
            self._commit()
            self.buf += EMPTY_LIST
            self._memoize(obj)
            save = self.save
            if len(obj) == 1:
                save(obj[0])
                self.buf += APPEND
                return
            for start in range(0, len(obj), BATCH):
                self.buf += MARK
                for x in obj[start:start + BATCH]:
                    save(x)
                self.buf += APPENDS
        elif obj is None:
            self.buf += NONE
        elif t is bool:
            self.buf += NEWTRUE if obj else NEWFALSE
        elif t is float:
            self.buf += BINFLOAT + struct.pack(">d", obj)
        elif t is tuple:
            self._save_tuple(obj)
        else:
            raise TypeError(f"cannot write {t.__name__}")

    def _save_tuple(self, obj):
        if not obj:
            self.buf += EMPTY_TUPLE
            return
        n = len(obj)
        if n <= 3:
            for x in obj:
                self.save(x)
            hit = self.memo.get(id(obj))
            if hit is not None:  # recursive tuple: not produced here
                self.buf += POP * n + hit[1]
                return
            self.buf += TUPLE_N[n]
        else:
            self.buf += MARK
            for x in obj:
                self.save(x)
            hit = self.memo.get(id(obj))
            if hit is not None:
                self.buf += POP_MARK + hit[1]
                return
            self.buf += TUPLE
        self._memoize(obj)

    @staticmethod
    def int_bytes(v):
        if 0 <= v <= 0xFF:
            return BININT1 + bytes((v,))
        if 0 <= v <= 0xFFFF:
            return BININT2 + struct.pack("<H", v)
        if -0x80000000 <= v <= 0x7FFFFFFF:
            return BININT + struct.pack("<i", v)
        data = pickle.encode_long(v)
        if len(data) >= 256:
            raise ValueError("integer too large for LONG1")
        return LONG1 + bytes((len(data),)) + data

    # ---- streaming one list whose items come from a generator

    def open_list(self, marker):
        """Writes an empty list (memoized under `marker`); items follow with
        list_items()."""
        self._commit()
        self.buf += EMPTY_LIST
        self._memoize(marker)

    def list_items(self, items, after_each=None):
        """Writes `items` (any iterable) into the list just opened, batched
        as save() batches a list; after_each(item) runs once the item is
        written."""
        batch = []
        written = 0

        def flush(last):
            nonlocal written
            if last and written == 0 and len(batch) == 1:
                self.save(batch[0])
                self.buf += APPEND
            elif batch:
                self.buf += MARK
                for x in batch:
                    self.save(x)
                self.buf += APPENDS
            if after_each:
                for x in batch:
                    after_each(x)
            written += len(batch)
            batch.clear()

        for x in items:
            batch.append(x)
            if len(batch) == BATCH:
                flush(False)
        flush(True)


class Model:
    """The synthetic training job: which events happen, in order."""

    def __init__(self, args):
        self.args = args
        self.frame_dicts = {}
        frame = self.frame
        self.stacks = []
        for site in range(args.sites):
            self.stacks.append([
                frame(f"{TORCH}/nn/modules/linear.py", "forward", 116),
                frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
                frame("/home/user/train.py", "forward", 20 + site),
                frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
                frame("/home/user/train.py", "train_step", 40),
            ])
        # Trainer frames between train_step and main.
        trainer = [(f"{TRAINER}/loops/loop{k % 6}.py", f"run_{k}", 100 + k) for k in range(args.depth - 6)]
        for stack in self.stacks:
            stack.extend(frame(*f) for f in trainer)
            stack.append(frame("/home/user/train.py", "main", 90))
        self.free_stack = [frame("/home/user/train.py", "train_step", 45)] + [frame(*f) for f in trainer]
        base = 0x7F0000000000
        self.segs = [base + i * 128 * MIB for i in range(args.segments)]
        self.cc, self.um = "N/A", ""

    def frame(self, filename, name, line):
        """A frame dict. With --fresh-stacks one per distinct frame, as
        symbolize() shares them; otherwise one per use (the original shape)."""
        if not self.args.fresh_stacks:
            return {"filename": filename, "name": name, "line": line}
        key = (filename, name, line)
        if key not in self.frame_dicts:
            self.frame_dicts[key] = {"filename": filename, "name": name, "line": line}
        return self.frame_dicts[key]

    def size(self, i, iteration):
        k = (i + iteration) % 97 if self.args.vary else i % 7
        return 16 * MIB + 512 * k

    def compile_context(self):
        """'N/A': one shared str, or (--fresh-compile-context) a new one."""
        return "".join(("N/", "A")) if self.args.fresh_compile_context else self.cc

    def stack(self, frames):
        return list(frames) if self.args.fresh_stacks else frames

    def events(self, target):
        """Yields the trace events; self.count and self.iterations after."""
        t = 1_700_000_000_000_000
        um = self.um
        count = 0
        iteration = 0
        while count < target:
            if iteration > 0 and self.args.empty_cache:
                for a in self.segs:
                    t += 3
                    yield {"action": "segment_free", "addr": a, "size": 64 * MIB, "stream": 0, "time_us": t,
                           "compile_context": self.compile_context(), "user_metadata": um,
                           "frames": self.stack(self.free_stack)}
                    count += 1
            for i, a in enumerate(self.segs):
                frames = self.stack(self.stacks[i % len(self.stacks)])
                if iteration == 0 or self.args.empty_cache:
                    t += 3
                    yield {"action": "segment_alloc", "addr": a, "size": 64 * MIB, "stream": 0, "time_us": t,
                           "compile_context": self.compile_context(), "user_metadata": um, "frames": frames}
                    count += 1
                t += 3
                yield {"action": "alloc", "addr": a, "size": self.size(i, iteration), "stream": 0, "time_us": t,
                       "compile_context": self.compile_context(), "user_metadata": um, "frames": frames}
                count += 1
            for i, a in enumerate(self.segs):
                size = self.size(i, iteration)
                frames = self.stack(self.free_stack)
                for action in ("free_requested", "free_completed"):
                    t += 3
                    yield {"action": action, "addr": a, "size": size, "stream": 0, "time_us": t,
                           "compile_context": self.compile_context(), "user_metadata": um, "frames": frames}
                    count += 1
            iteration += 1
        if self.args.fragmented:  # a tensor kept at the start of every segment
            for i, a in enumerate(self.segs):
                t += 3
                yield {"action": "alloc", "addr": a, "size": KEPT, "stream": 0, "time_us": t,
                       "compile_context": self.compile_context(), "user_metadata": um, "frames": self.stack(self.stacks[0])}
                count += 1
        self.count = count
        self.iterations = iteration
        oom = {"device_free": 0, "size": 60 * MIB} if self.args.fragmented else {"device_free": 1 << 30,
                                                                                  "size": 8 << 30}
        yield {"action": "oom", **oom, "stream": 0, "time_us": t + 5,
               "compile_context": self.compile_context(), "user_metadata": um, "frames": self.stacks[0]}
        self.count += 1

    def segments(self):
        kept = KEPT if self.args.fragmented else 0
        return [{"device": 0, "address": a, "total_size": 64 * MIB, "allocated_size": kept, "active_size": kept,
                 "requested_size": kept, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": self.stacks[0],
                 "blocks": ([{"address": a, "size": kept, "requested_size": kept, "state": "active_allocated",
                              "frames": self.stacks[0]}] if kept else [])
                 + [{"address": a + kept, "size": 64 * MIB - kept, "requested_size": 0, "state": "inactive",
                     "frames": []}]} for a in self.segs]

    @staticmethod
    def settings():
        return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}


def write(f, args):
    """Streams the snapshot into f; returns the Model (event counts)."""
    model = Model(args)
    p = StreamPickler(f)
    p.begin()
    top = {}
    p.save(top)  # EMPTY_DICT + MEMOIZE; its items follow by hand
    p.buf += MARK
    p.save("segments")
    p.save(model.segments())
    p.save("device_traces")
    traces = []
    p.open_list(traces)   # device_traces: one trace, written as APPEND
    trace_marker = []
    p.open_list(trace_marker)
    shared = {id(s) for s in model.stacks} | {id(model.free_stack)}

    def drop(event):  # forget what only this event (and its pair) refers to
        p.forget(event)
        if args.fresh_compile_context:
            p.forget(event["compile_context"])
        frames = event["frames"]
        if id(frames) not in shared and event["action"] in ("alloc", "free_completed", "segment_free"):
            p.forget(frames)

    p.list_items(model.events(args.events), drop)
    p.buf += APPEND  # the trace into device_traces
    p.save("allocator_settings")
    p.save(model.settings())
    p.save("external_annotations")
    p.save([])
    p.buf += SETITEMS
    p.end()
    return model


def reference(args):
    """The same snapshot built in memory (for --self-test, small sizes)."""
    model = Model(args)
    trace = list(model.events(args.events))
    return {"segments": model.segments(), "device_traces": [trace], "allocator_settings": model.settings(),
            "external_annotations": []}


def opcodes(data):
    import pickletools
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data) if op.name != "FRAME"]


def self_test():
    cases = [[], ["--fresh-compile-context", "--segments", "3"], ["--fresh-stacks", "--vary", "--depth", "10", "--sites", "3", "--segments", "5"], ["--real"],
             ["--fragmented", "--segments", "5"], ["--empty-cache", "--segments", "4", "--fresh-stacks"]]
    for extra in cases:
        for events in (1, 300, 5000):
            args = parse_args(["-", str(events)] + extra)
            buf = io.BytesIO()
            write(buf, args)
            ours = buf.getvalue()
            want = pickle.dumps(reference(args), protocol=4)
            same_ops = opcodes(ours) == opcodes(want)
            same_value = pickle.loads(ours) == pickle.loads(want)
            print(f"{' '.join(extra) or '(default)'} {events} events: {len(ours)} bytes, opcodes "
                  f"{'identical' if same_ops else 'DIFFER'} to pickle.dumps, value {'equal' if same_value else 'DIFFERS'}")
            if not (same_ops and same_value):
                sys.exit(1)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("events", nargs="?", type=int, default=1_000_000)
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--sites", type=int, default=8)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--fresh-stacks", action="store_true")
    ap.add_argument("--vary", action="store_true")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--fragmented", action="store_true")
    ap.add_argument("--fresh-compile-context", action="store_true")
    ap.add_argument("--empty-cache", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if args.real:
        args.segments, args.sites, args.depth = 512, 256, 24
        args.fresh_stacks = args.vary = args.fresh_compile_context = True
    if args.segments < 1 or args.sites < 1 or args.depth < 6:
        ap.error("--segments and --sites must be >= 1, --depth >= 6")
    if not args.self_test and not args.out:
        ap.error("OUT.pickle is required")
    return args


def main():
    args = parse_args(sys.argv[1:])
    if args.self_test:
        self_test()
        return
    with open(args.out, "wb") as f:
        model = write(f, args)
    print(f"{args.out}: {model.count} trace events, {model.iterations} iterations")


if __name__ == "__main__":
    main()
