import json
import os
import struct
import unittest
from unittest import mock

import numpy as np

from helpers import TempDir

from dflash_prepare import shards


def independent_read(path):
    """A second reader, from the format's definition alone: header length,
    JSON header, then raw little-endian bytes at the offsets."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode())
    return n, header, raw[8 + n:]


class ShardRoundTripTest(TempDir):
    def tensors(self):
        return {
            "input_ids": shards.Tensor("I32", np.arange(12, dtype=np.int32).reshape(3, 4) - 2),
            "loss_mask": shards.Tensor("U8", np.array([[0, 1, 1, 0]] * 3, dtype=np.uint8)),
            "hidden_states": shards.Tensor(
                "BF16", shards.float32_to_bf16_bits(np.linspace(-2, 2, 3 * 4 * 5).reshape(3, 4, 5))),
            "position_ids": shards.Tensor("I32", np.tile(np.arange(4, dtype=np.int32), (3, 1))),
        }

    def test_round_trip(self):
        path = self.path("a.safetensors")
        tensors = self.tensors()
        meta = {"target": "t", "seq_len": "4"}
        size = shards.write_shard(path, tensors, meta)
        self.assertEqual(size, os.path.getsize(path))
        shard = shards.SafetensorsFile(path)
        self.assertEqual(shard.metadata, meta)
        self.assertEqual(set(shard.tensors), set(tensors))
        for name, tensor in tensors.items():
            self.assertEqual(shard.tensors[name].dtype, tensor.dtype)
            np.testing.assert_array_equal(shard.load(name), tensor.array)

    def test_byte_layout(self):
        path = self.path("a.safetensors")
        tensors = self.tensors()
        shards.write_shard(path, tensors, {"k": "v"})
        n, header, data = independent_read(path)
        self.assertEqual((8 + n) % 8, 0, "data must start 8-aligned")
        self.assertEqual(header["__metadata__"], {"k": "v"})
        # Wider dtypes first, then by name, back to back from offset 0.
        order = sorted((e["data_offsets"][0], name) for name, e in header.items()
                       if name != "__metadata__")
        self.assertEqual([name for _, name in order],
                         ["input_ids", "position_ids", "hidden_states", "loss_mask"])
        end = 0
        for _, name in order:
            begin, stop = header[name]["data_offsets"]
            self.assertEqual(begin, end)
            self.assertEqual(begin % {"I32": 4, "BF16": 2, "U8": 1}[header[name]["dtype"]], 0)
            end = stop
        self.assertEqual(end, len(data))
        ids = header["input_ids"]
        self.assertEqual(ids["dtype"], "I32")
        self.assertEqual(ids["shape"], [3, 4])
        values = struct.unpack("<12i", data[ids["data_offsets"][0]:ids["data_offsets"][1]])
        self.assertEqual(list(values), list(range(-2, 10)))
        hidden = header["hidden_states"]
        first = struct.unpack("<H", data[hidden["data_offsets"][0]:hidden["data_offsets"][0] + 2])[0]
        self.assertEqual(first, 0xC000)  # -2.0 in bf16

    def test_row_selection(self):
        path = self.path("a.safetensors")
        tensors = self.tensors()
        shards.write_shard(path, tensors, rows=[2, 0])
        shard = shards.SafetensorsFile(path)
        for name, tensor in tensors.items():
            np.testing.assert_array_equal(shard.load(name), tensor.array[[2, 0]])

    def test_bf16_conversion(self):
        values = np.array([0.0, -0.0, 1.0, -2.5, 3.140625, 1e-40, np.inf, -np.inf,
                           1.00390625, 1.01171875, 3.4e38, np.nan], dtype=np.float32)
        bits = shards.float32_to_bf16_bits(values)
        self.assertEqual(list(bits[:8]), [0x0000, 0x8000, 0x3F80, 0xC020, 0x4049, 0x0001,
                                          0x7F80, 0xFF80])
        self.assertEqual(bits[8], 0x3F80)   # tie: rounds to the even 1.0
        self.assertEqual(bits[9], 0x3F82)   # tie: rounds up to the even 1.015625
        self.assertEqual(bits[10], 0x7F80)  # past the largest bf16: infinity
        self.assertTrue(shards.bf16_nonfinite(bits[11]))
        self.assertEqual(list(shards.bf16_nonfinite(bits)),
                         [False] * 6 + [True, True] + [False, False, True, True])
        back = shards.bf16_bits_to_float32(bits[:6])
        np.testing.assert_array_equal(back[:5], values[:5])

    def test_atomic_write_leaves_no_half_file(self):
        path = self.path("a.safetensors")
        tensors = self.tensors()
        real_replace = os.replace
        with mock.patch("os.replace", side_effect=OSError(28, "No space left on device")):
            with self.assertRaises(shards.UserError) as caught:
                shards.write_shard(path, tensors)
        self.assertIn("cannot write", str(caught.exception))
        self.assertEqual(os.listdir(self.dir), ["small.toml"])
        # A crash mid-write (no cleanup) leaves only a hidden temp file that no
        # reader takes for a shard, and that the next run removes.
        temp = shards.temp_path_for(path)
        with open(temp, "wb") as f:
            f.write(b"half")
        self.assertEqual(shards.list_shards(self.dir), [])
        self.assertEqual(shards.remove_stale_temps(self.dir), 1)
        self.assertIs(os.replace, real_replace)

    def test_reader_errors(self):
        path = self.path("a.safetensors")
        shards.write_shard(path, self.tensors())
        with open(path, "rb") as f:
            raw = f.read()

        def expect(data, message):
            bad = self.path("bad.safetensors")
            with open(bad, "wb") as f:
                f.write(data)
            with self.assertRaises(shards.ShardError) as caught:
                shards.SafetensorsFile(bad)
            self.assertIn(bad, str(caught.exception))
            self.assertIn(message, str(caught.exception))

        expect(raw[:5], "too short")
        expect(raw[:-3], "the file is truncated")
        expect(struct.pack("<Q", 1 << 40) + raw[8:], "larger than the 100 MiB limit")
        header = json.dumps({"x": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                             "y": {"dtype": "I32", "shape": [2], "data_offsets": [4, 12]}}).encode()
        expect(struct.pack("<Q", len(header)) + header + bytes(12), "overlap")
        header = json.dumps({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}).encode()
        expect(struct.pack("<Q", len(header)) + header + bytes(8), "unsupported dtype 'Q4'")
        header = json.dumps({"x": {"dtype": "I32", "shape": [3], "data_offsets": [0, 8]}}).encode()
        expect(struct.pack("<Q", len(header)) + header + bytes(8), "span 8 bytes")
        expect(struct.pack("<Q", 4) + b"{{{{", "not valid json")

    def test_header_that_lies_about_sizes(self):
        """A shape whose byte count overflows int64 (it once passed as 0 bytes,
        and check then tried to allocate it), a dimension past int64, and a
        header nested past python's json reader: each a named ShardError."""
        def expect(header, message):
            bad = self.path("bad.safetensors")
            raw = header if isinstance(header, bytes) else json.dumps(header).encode()
            with open(bad, "wb") as f:
                f.write(struct.pack("<Q", len(raw)) + raw)
            with self.assertRaises(shards.ShardError) as caught:
                shards.SafetensorsFile(bad)
            self.assertIn(f"{bad}: {message}", str(caught.exception))

        expect({"input_ids": {"dtype": "I32", "shape": [2 ** 62, 16], "data_offsets": [0, 0]}},
               f"tensor 'input_ids' has shape [{2 ** 62}, 16] of I32 ({2 ** 68} bytes) but "
               "data_offsets [0, 0] span 0 bytes")
        expect({"x": {"dtype": "U8", "shape": [2 ** 70], "data_offsets": [0, 0]}},
               f"tensor 'x' has shape [{2 ** 70}] of U8 ({2 ** 70} bytes) but "
               "data_offsets [0, 0] span 0 bytes")
        expect(b"[" * 100000 + b"]" * 100000, "header nests deeper than python's json reader")

    def test_unlistable_directory_is_named(self):
        with mock.patch("os.listdir", side_effect=PermissionError(13, "Permission denied")):
            with self.assertRaises(shards.UserError) as caught:
                shards.list_shards(self.dir)
        self.assertEqual(str(caught.exception), f"{self.dir}: cannot list: Permission denied")


if __name__ == "__main__":
    unittest.main()
