"""Safetensors with numpy alone, written atomically.

Layout (the format's own): 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, padded with
spaces to a multiple of 8 bytes, then the tensors back to back. BF16 tensors
travel as their raw uint16 bits: numpy has no bfloat16, and CI has no
`safetensors` package. The writer orders tensors as the C++ runtime's writer
does (wider dtypes first, then by name) so that every tensor is aligned.
"""
import json
import math
import os
import struct

import numpy as np

from .errors import UserError

# safetensors dtype -> numpy dtype of the stored bits (little-endian).
DTYPES = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}

# The same limit as the C++ reader: a corrupt length cannot exhaust memory.
MAX_HEADER_BYTES = 100 << 20


class ShardError(UserError):
    """A file that is not a readable safetensors file."""


class WriteFailed(UserError):
    """A file that could not be written (a full disk, a read-only or vanished
    directory); nothing of it is left behind under its name. `why`: the
    system's reason."""

    def __init__(self, path, why):
        super().__init__(f"{path}: cannot write: {why}")
        self.why = why


def _why(error):
    return error.strerror or str(error)


class Tensor:
    """A named array with its safetensors dtype (BF16 data is uint16 bits)."""

    def __init__(self, dtype, array):
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype}")
        self.dtype = dtype
        self.array = np.ascontiguousarray(array, dtype=DTYPES[dtype])

    @property
    def shape(self):
        return list(self.array.shape)


def float32_to_bf16_bits(values):
    """Rounds float32 values to the nearest bf16, ties to even, as uint16 bits
    (NaN stays a quiet NaN of the same sign)."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(f)
    quiet = ((bits >> 16) | 0x0040)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bf16_bits_to_float32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_nonfinite(bits):
    """True where the bf16 bits are an infinity or a NaN (exponent all ones)."""
    return (np.asarray(bits, dtype=np.uint16) & 0x7F80) == 0x7F80


def _fsync_directory(directory):
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the rename stands
    finally:
        os.close(fd)


def temp_path_for(path):
    """The hidden temp name beside `path`: not a *.safetensors name, so that
    no reader of the directory takes a half-written file for a shard."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def remove_stale_temps(directory):
    """Removes temp files an interrupted run of this tool left behind."""
    removed = 0
    for name in os.listdir(directory):
        if name.startswith(".") and ".tmp-" in name:
            try:
                os.remove(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
    return removed


class AtomicFile:
    """A file written under a temp name in the target's directory, fsync'd
    and renamed over the target on commit; removed on failure."""

    def __init__(self, path):
        self.path = path
        self.temp = temp_path_for(path)
        try:
            self.file = open(self.temp, "wb")
        except OSError as error:
            raise WriteFailed(path, _why(error)) from None

    def commit(self):
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.temp, self.path)
        except OSError as error:
            self.abort()
            raise WriteFailed(self.path, _why(error)) from None
        _fsync_directory(os.path.dirname(self.path))

    def abort(self):
        try:
            self.file.close()
        except OSError:
            pass
        try:
            os.remove(self.temp)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, kind, value, trace):
        if kind is None:
            self.commit()
            return False
        self.abort()
        if issubclass(kind, OSError):
            # A write that failed part way (ENOSPC, EIO): the temp file is
            # gone, and the error is the file's, in one line.
            raise WriteFailed(self.path, _why(value)) from None
        return False


def write_json_atomically(path, value):
    with AtomicFile(path) as f:
        f.file.write((json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def _header_bytes(entries, metadata):
    header = dict(entries)
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata {key!r}: keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    # Spaces so that the data, and each tensor in it, starts 8-aligned.
    return text + b" " * ((8 - (len(text) + 8) % 8) % 8)


def _layout(tensors, rows=None):
    """(name, Tensor) in writing order, and the header entries. With `rows`
    every tensor keeps only that many rows."""
    for name in tensors:
        if not name or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
    order = sorted(tensors.items(),
                   key=lambda item: (-DTYPES[item[1].dtype].itemsize, item[0]))
    entries, offset = {}, 0
    for name, tensor in order:
        shape = tensor.shape if rows is None else [len(rows)] + tensor.shape[1:]
        size = int(np.prod(shape, dtype=np.int64)) * DTYPES[tensor.dtype].itemsize
        entries[name] = {"dtype": tensor.dtype, "shape": shape,
                         "data_offsets": [offset, offset + size]}
        offset += size
    return order, entries


def write_shard(path, tensors, metadata=None, rows=None):
    """Writes `tensors` ({name: Tensor}) to `path` atomically and returns its
    size. With `rows` (a list of indices) only those rows of every tensor are
    written, in that order, without copying the tensors (feature shards are
    large)."""
    rows = None if rows is None else list(rows)
    order, entries = _layout(tensors, rows)
    header = _header_bytes(entries, metadata)
    with AtomicFile(path) as out:
        out.file.write(struct.pack("<Q", len(header)))
        out.file.write(header)
        for name, tensor in order:
            if rows is None:
                out.file.write(memoryview(tensor.array.reshape(-1)).cast("B"))
            else:
                for r in rows:
                    out.file.write(memoryview(tensor.array[r].reshape(-1)).cast("B"))
    return os.path.getsize(path)


def shard_bytes(shapes):
    """The size of a shard holding tensors of these {name: (dtype, shape)},
    without its header."""
    total = 0
    for dtype, shape in shapes.values():
        total += int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
    return total


class TensorInfo:
    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.begin, self.end = begin, end


class SafetensorsFile:
    """An opened shard: `metadata`, `tensors` ({name: TensorInfo}) and
    `array(name)`, a read-only memory map of one tensor (BF16 as uint16)."""

    def __init__(self, path):
        self.path = path
        fail = lambda what: ShardError(f"{path}: {what}")
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                prefix = f.read(8)
                if size < 8:
                    raise fail(f"file is {size} bytes, too short for a safetensors "
                               "header (truncated or not a safetensors file)")
                (header_size,) = struct.unpack("<Q", prefix)
                if header_size > MAX_HEADER_BYTES:
                    raise fail(f"header length {header_size} is larger than the "
                               "100 MiB limit (corrupt or not a safetensors file)")
                if header_size > size - 8:
                    raise fail(f"header length {header_size} runs past the end of "
                               f"the file ({size} bytes): the file is truncated")
                raw = f.read(header_size)
        except OSError as error:
            raise fail(f"cannot read: {error.strerror}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise fail("header is not valid json") from None
        except RecursionError:
            raise fail("header nests deeper than python's json reader follows "
                       "(corrupt or not a safetensors file)") from None
        if not isinstance(header, dict):
            raise fail("header is not a json object")
        self.data_start = 8 + header_size
        data_size = size - self.data_start
        self.metadata = {}
        self.tensors = {}
        extents = []
        for name, entry in header.items():
            if name == "__metadata__":
                if not isinstance(entry, dict):
                    raise fail("'__metadata__' is not a json object")
                for key, value in entry.items():
                    if not isinstance(value, str):
                        raise fail(f"'__metadata__' entry '{key}' is not a string")
                self.metadata = dict(entry)
                continue
            what = f"tensor '{name}'"
            if not isinstance(entry, dict):
                raise fail(f"{what}: header entry is not a json object")
            dtype = entry.get("dtype")
            if not isinstance(dtype, str):
                raise fail(f"{what} has no 'dtype' string")
            if dtype not in DTYPES:
                raise fail(f"{what} has unsupported dtype '{dtype}'")
            shape = entry.get("shape")
            if (not isinstance(shape, list) or
                    any(not isinstance(e, int) or isinstance(e, bool) or e < 0
                        for e in shape)):
                raise fail(f"{what} has no 'shape' list of non-negative integers")
            offsets = entry.get("data_offsets")
            if (not isinstance(offsets, list) or len(offsets) != 2 or
                    any(not isinstance(e, int) or isinstance(e, bool) or e < 0
                        for e in offsets)):
                raise fail(f"{what} has no 'data_offsets' pair of non-negative integers")
            begin, end = offsets
            # Python's integers: numpy's int64 product wraps, and a lying
            # shape of 2**62 rows would pass as 0 bytes.
            expected = math.prod(shape) * DTYPES[dtype].itemsize
            if end < begin:
                raise fail(f"{what} has data_offsets {offsets} that end before they begin")
            if end - begin != expected:
                raise fail(f"{what} has shape {shape} of {dtype} ({expected} bytes) "
                           f"but data_offsets {offsets} span {end - begin} bytes")
            if end > data_size:
                raise fail(f"{what} has data_offsets {offsets} past the end of the "
                           f"data ({data_size} bytes): the file is truncated")
            self.tensors[name] = TensorInfo(name, dtype, shape, begin, end)
            extents.append((begin, end, name))
        extents.sort()
        reached, by = 0, None
        for begin, end, name in extents:
            if begin == end:
                continue
            if begin < reached:
                raise fail(f"tensors '{by}' and '{name}' overlap in the data")
            reached, by = end, name

    def array(self, name):
        info = self.tensors[name]
        dtype = DTYPES[info.dtype]
        if info.end == info.begin:
            return np.zeros(info.shape, dtype=dtype)
        return np.memmap(self.path, dtype=dtype, mode="r",
                         offset=self.data_start + info.begin,
                         shape=tuple(info.shape))

    def load(self, name):
        """A tensor as an in-memory copy."""
        return np.array(self.array(name))


def list_shards(directory):
    """The `*.safetensors` files of a directory, sorted by name, as the C++
    reader takes them."""
    if not os.path.isdir(directory):
        raise UserError(f"{directory}: not a directory")
    try:
        listed = os.listdir(directory)
    except OSError as error:
        raise UserError(f"{directory}: cannot list: {error.strerror}") from None
    names = sorted(n for n in listed
                   if n.endswith(".safetensors")
                   and os.path.isfile(os.path.join(directory, n)))
    return [os.path.join(directory, n) for n in names]


def shard_name(index):
    return f"shard-{index:05d}.safetensors"
