import os
import sys
import unittest
from unittest import mock

from helpers import PREPARE, ROOT, SMALL_SPEC, SPECS, TempDir, run_tool

from dflash_prepare.spec import (SCHEMA, TABLES, SpecError, default_layer_ids, load_spec,
                                 read_spec)

# test/Prepare/Inputs/spec_sources.py reads the C++ reader's sources; only a
# checkout has them.
SOURCES = os.path.join(ROOT, "test", "Prepare", "Inputs")
SPEC_CPP = os.path.join(ROOT, "compiler", "Spec", "Spec.cpp")
SPEC_TEST_CPP = os.path.join(ROOT, "test", "unit", "SpecTest.cpp")
IN_CHECKOUT = all(os.path.isfile(p) for p in (SPEC_CPP, SPEC_TEST_CPP,
                                              os.path.join(SOURCES, "spec_sources.py")))

BASE = SMALL_SPEC.format(seq_len=16)


class SpecTest(TempDir):
    def test_shipped_specs(self):
        tiny = load_spec(os.path.join(SPECS, "tiny.toml"))
        self.assertEqual(tiny.layer_ids, [1, 5])  # spread rule, as dflashc prints
        self.assertTrue(tiny.layer_ids_defaulted)
        self.assertEqual((tiny.seq_len, tiny.vocab_size, tiny.mask_token_id), (128, 1024, 1023))
        self.assertEqual(tiny.context_width, 512)
        qwen = load_spec(os.path.join(SPECS, "qwen3-8b-b16.toml"))
        self.assertEqual(qwen.layer_ids, [1, 9, 17, 25, 33])
        self.assertEqual(qwen.shard_metadata(), {
            "target": "Qwen/Qwen3-8B", "target_layer_ids": "[1, 9, 17, 25, 33]",
            "hidden_size": "4096", "seq_len": "3072"})
        for name in sorted(os.listdir(SPECS)):
            if name.endswith(".toml"):
                read_spec(os.path.join(SPECS, name))

    def test_spread_rule_rounds_half_to_even(self):
        self.assertEqual(default_layer_ids(36, 5), [1, 9, 17, 25, 33])
        self.assertEqual(default_layer_ids(8, 2), [1, 5])
        self.assertEqual(default_layer_ids(48, 8), [1, 7, 14, 20, 26, 32, 39, 45])
        self.assertEqual(default_layer_ids(9, 3), [1, 4, 6])  # 3.5 -> 4, 6
        self.assertEqual(default_layer_ids(7, 1), [3])

    def refused(self, text, name="bad.toml"):
        """read_spec's diagnostic of `text` (bytes or str)."""
        path = self.path(name)
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        with self.assertRaises(SpecError) as caught:
            read_spec(path)
        return str(caught.exception).replace(path, name)

    def test_a_new_users_mistakes_name_the_file_line_and_field(self):
        # Each was read without a word before: [trainng] gave seq_len 3072.
        self.assertEqual(self.refused(BASE + "[trainng]\nseq_len = 2048\n"),
                         "bad.toml:20:2: error: unknown key 'trainng' at the top level "
                         "(see docs/spec.md)")
        self.assertEqual(self.refused(BASE.replace("seq_len =", "seq_lenn =")),
                         "bad.toml:17:1: error: unknown key 'training.seq_lenn' in [training]; "
                         "did you mean 'seq_len'?")
        self.assertEqual(self.refused(BASE + "[optimizer]\nlr = \"0.1\"\n"),
                         "bad.toml:21:6: error: 'optimizer.lr' must be a number, not a string")
        self.assertEqual(self.refused(BASE.replace("seq_len = 16", "seq_len = 2097152")),
                         "bad.toml:17:11: error: 'training.seq_len' is 2097152; it must be "
                         "at most 1048576")
        self.assertEqual(self.refused(BASE.replace("num_heads = 2", "num_heads = 0")),
                         "bad.toml:11:13: error: 'drafter.num_heads' is 0; it must be at "
                         "least 1")
        self.assertEqual(self.refused(BASE + "[memory]\ngpu_memory_gib = inf\n"),
                         "bad.toml:21:18: error: 'memory.gpu_memory_gib' must be a finite "
                         "number")
        self.assertEqual(self.refused(BASE.replace("[drafter]", "[drafter.x]\ny = 1\n[drafter]")),
                         "bad.toml:8:10: error: unknown key 'drafter.x' in [drafter] "
                         "(see docs/spec.md)")

    def test_non_utf8_is_an_error_at_its_line(self):
        # A traceback (UnicodeDecodeError) before.
        self.assertEqual(self.refused(BASE.encode().replace(b'"small"', b'"sm\xe9ll"')),
                         "bad.toml:1:10: error: invalid TOML: byte 0xE9 after this point is "
                         "not UTF-8 (a spec is UTF-8 text)")
        self.assertTrue(self.refused(BASE.encode() + b"# \xff\n").startswith("bad.toml:20:2:"))
        self.assertTrue(self.refused(b"\xff").startswith("bad.toml:1:1: error: invalid TOML"))
        # A byte-order mark is no error (dflashc skips it too).
        path = self.write_spec("\ufeff" + BASE, "bom.toml")
        self.assertEqual(read_spec(path).name, "small")

    def test_rules_and_syntax(self):
        self.assertEqual(self.refused(BASE.replace("mask_token_id = 63", "mask_token_id = 64")),
                         "bad.toml:15:17: error: 'drafter.mask_token_id' (64) is outside the "
                         "vocabulary of 'target.vocab_size' (64)")
        self.assertEqual(self.refused(BASE.replace("layer_ids = [0, 2]", "layer_ids = [\n2,\n2]")),
                         "bad.toml:9:1: error: 'target.layer_ids' must be strictly ascending, "
                         "but entry 1 (2) follows 2")
        self.assertEqual(self.refused(BASE.replace("block_size = 4\n", "")),
                         "bad.toml:8:1: error: missing required key 'drafter.block_size'")
        self.assertEqual(self.refused("name = ["), "bad.toml:1:9: error: invalid TOML: "
                         "Invalid value")
        self.assertTrue(self.refused("name = [\n").startswith("bad.toml:1:10: error: invalid TOML"))
        self.assertTrue(self.refused("a = 1\nname = [").startswith("bad.toml:2:9: error: invalid TOML"))
        with self.assertRaises(SpecError) as caught:
            read_spec(self.path("none.toml"))
        self.assertEqual(str(caught.exception),
                         f"{self.path('none.toml')}: error: cannot open spec file: no such file")

    def test_rope_scaling(self):
        """[drafter.rope_scaling] (YaRN): read, and each rule refused at its
        line and field, as dflashc does."""
        yarn = ("[drafter.rope_scaling]\nrope_type = \"yarn\"\nfactor = {factor}\n"
                "original_max_position_embeddings = {original}\n{more}")

        def spec(factor="4.0", original="8192", more=""):
            return BASE + yarn.format(factor=factor, original=original, more=more)

        read_spec(self.write_spec(spec(more="beta_fast = 16\ntruncate = false\n"
                                            "attention_factor = 1.2\n"), "yarn.toml"))
        self.assertEqual(self.refused(spec(factor="1.0")),
                         "bad.toml:22:10: error: 'drafter.rope_scaling.factor' is 1; YaRN's "
                         "factor must be above 1")
        self.assertEqual(self.refused(spec(factor='"4"')),
                         "bad.toml:22:10: error: 'drafter.rope_scaling.factor' must be a "
                         "number, not a string")
        self.assertEqual(self.refused(spec(original="40960")),
                         "bad.toml:23:36: error: "
                         "'drafter.rope_scaling.original_max_position_embeddings' (40960) "
                         "must be below 'drafter.max_position_embeddings' (40960): the "
                         "context YaRN extends is the shorter one")
        self.assertEqual(self.refused(spec(original="0")),
                         "bad.toml:23:36: error: "
                         "'drafter.rope_scaling.original_max_position_embeddings' is 0; it "
                         "must be at least 1")
        self.assertEqual(self.refused(spec(original="8192.5")),
                         "bad.toml:23:36: error: "
                         "'drafter.rope_scaling.original_max_position_embeddings' must be an "
                         "integer, not a float")
        self.assertEqual(self.refused(spec().replace('"yarn"', '"dynamic"')),
                         "bad.toml:21:13: error: 'drafter.rope_scaling.rope_type' is "
                         "\"dynamic\"; only YaRN (\"yarn\") is supported")
        self.assertEqual(self.refused(spec(more="mscale = 1.0\n")),
                         "bad.toml:24:1: error: unknown key 'drafter.rope_scaling.mscale' in "
                         "[drafter.rope_scaling] (see docs/spec.md)")
        self.assertEqual(self.refused(spec(more="beta_fast = 0.5\n")),
                         "bad.toml:24:13: error: 'drafter.rope_scaling.beta_fast' must be at "
                         "least 'drafter.rope_scaling.beta_slow'")
        self.assertEqual(self.refused(BASE + "[drafter.rope_scaling]\nfactor = 4.0\n"
                                             "original_max_position_embeddings = 8192\n"),
                         "bad.toml:20:1: error: missing required key "
                         "'drafter.rope_scaling.rope_type'")

    def test_dflash2(self):
        """[drafter.dflash2] and [training.dflash2] (docs/semantics.md section
        13): read, and refused at the line and field dflashc names. A DFlash2
        drafter trains on the same tokens and features, so the data tools
        read its spec; Spec.dflash2 says what it is."""
        self.assertTrue(read_spec(os.path.join(SPECS, "tiny-dflash2.toml")).dflash2)
        qwen = read_spec(os.path.join(SPECS, "qwen3.8-27b-dflash2-b8.toml"))
        self.assertTrue(qwen.dflash2)
        self.assertEqual((qwen.layer_ids, qwen.block_size, qwen.seq_len, qwen.mask_token_id),
                         ([5, 19, 33, 47, 61], 8, 8192, 248070))
        self.assertFalse(read_spec(os.path.join(SPECS, "tiny.toml")).dflash2)
        spec = read_spec(self.write_spec(BASE + "[drafter.dflash2]\nconv_group_size = 4\n"
                                                "[training.dflash2]\nselector_gold = "
                                                "\"inject\"\n", "d2.toml"))
        self.assertTrue(spec.dflash2)
        # The default group of 16 channels does not divide hidden_size 8: the
        # error is at the table, where the default comes from.
        self.assertEqual(self.refused(BASE + "[drafter.dflash2]\n"),
                         "bad.toml:20:1: error: 'drafter.dflash2.conv_group_size' (16) does "
                         "not divide 'drafter.hidden_size' (8): the channels form "
                         "hidden_size / conv_group_size groups")
        d2 = BASE + "[drafter.dflash2]\nconv_group_size = 8\n"
        self.assertEqual(self.refused(d2 + "selector_top_k = 65\n"),
                         "bad.toml:22:18: error: 'drafter.dflash2.selector_top_k' (65) is "
                         "above 'target.vocab_size' (64): the selector re-ranks the top K "
                         "tokens")
        self.assertEqual(self.refused(d2 + "conv_kernel_size = 5\n"),
                         "bad.toml:22:20: error: 'drafter.dflash2.conv_kernel_size' is 5; the "
                         "DFlash2 convolution kernels take at most 4 taps")
        self.assertEqual(self.refused(BASE + "[training.dflash2]\nselector_alpha = 2.0\n"),
                         "bad.toml:20:1: error: [training.dflash2] sets the loss of a "
                         "selector, but the drafter has no selector: only a DFlash2 drafter "
                         "(a [drafter.dflash2] table) has one")
        self.assertEqual(self.refused(d2 + "[training.dflash2]\nselector_gold = \"inject\"\n"
                                           "selector_denominator = \"covered\"\n"),
                         "bad.toml:24:24: error: 'training.dflash2.selector_denominator' = "
                         "\"covered\" contradicts 'training.dflash2.selector_gold' = "
                         "\"inject\": an injected label covers every slot (cov = 1), so "
                         "\"covered\" would divide by the same sum as \"all\"; say \"all\"")
        self.assertEqual(self.refused(d2 + "[training.dflash2]\nselector_warmup_ratio = 0.5\n"
                                           "selector_ramp_ratio = 0.75\n"),
                         "bad.toml:24:23: error: 'training.dflash2.selector_warmup_ratio' + "
                         "'training.dflash2.selector_ramp_ratio' must be at most 1: the ramp "
                         "would end after the last step")

    @unittest.skipUnless(IN_CHECKOUT, "needs the checkout's C++ spec reader sources")
    def test_the_broken_specs_of_the_cpp_reader(self):
        """SpecTest.cpp's cases: read_spec refuses each with the message
        and on the line that test expects of dflashc."""
        sys.path.insert(0, SOURCES)
        try:
            from spec_sources import cpp_error_cases, cpp_schema
        finally:
            sys.path.remove(SOURCES)
        keys, tables = cpp_schema(SPEC_CPP)
        self.assertEqual(keys, [k for k in SCHEMA if k.table] + [k for k in SCHEMA if not k.table])
        self.assertEqual(tuple(tables), TABLES)
        base, cases = cpp_error_cases(SPEC_TEST_CPP)
        self.assertGreater(len(cases), 30)
        self.write_spec(base, "base.toml")
        read_spec(self.path("base.toml"))
        for case in cases:
            with self.subTest(case.name):
                diagnostic = self.refused(case.text(base))
                self.assertIn(case.message, diagnostic)
                self.assertTrue(diagnostic.startswith(f"bad.toml:{case.line(base)}:"),
                                diagnostic)


def fake_dflashc(directory, stderr="", status=0):
    """An executable that answers like `dflashc SPEC --emit=spec`, and
    leaves its arguments in directory/args."""
    path = os.path.join(directory, "dflashc")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\n"
                f"open({os.path.join(directory, 'args')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                f"sys.stderr.write({stderr!r})\nsys.exit({status})\n")
    os.chmod(path, 0o755)
    return path


class DflashcTest(TempDir):
    """load_spec has dflashc check the spec where one is at hand."""

    def test_its_diagnostics_pass_through(self):
        said = "x.toml:3:1: error: unknown key 'trainng' at the top level (see docs/spec.md)\n"
        dflashc = fake_dflashc(self.dir, said, 1)
        with mock.patch.dict(os.environ, {"DFLASHC": dflashc}):
            with self.assertRaises(SpecError) as caught:
                load_spec(self.spec_path)
        self.assertEqual(str(caught.exception), said.strip())
        with open(self.path("args")) as f:
            self.assertEqual(f.read(), f"{self.spec_path} --emit=spec")
        status, out, err = run_tool(PREPARE, "check", self.dir, "--spec", self.spec_path,
                                    env={"DFLASHC": dflashc})
        self.assertEqual((status, err), (2, said))

    def test_what_it_accepts_is_read_without_the_unknown_key_check(self):
        # A newer dflashc knows a key this reader's schema does not.
        path = self.write_spec(BASE + "[parallel]\nnew_key = 1\n", "newer.toml")
        with mock.patch.dict(os.environ, {"DFLASHC": fake_dflashc(self.dir)}):
            self.assertEqual(load_spec(path).seq_len, 16)
        with mock.patch.dict(os.environ, {"DFLASHC": "none"}):
            with self.assertRaises(SpecError):
                load_spec(path)

    def test_without_dflashc_the_own_reader_refuses(self):
        path = self.write_spec(BASE + "[trainng]\nseq_len = 2048\n", "typo.toml")
        status, out, err = run_tool(PREPARE, "check", self.dir, "--spec", path,
                                    env={"DFLASHC": "none"})
        self.assertEqual(status, 2)
        self.assertEqual(err, f"{path}:20:2: error: unknown key 'trainng' at the top level "
                         "(see docs/spec.md)\n")
        status, _, err = run_tool(PREPARE, "check", self.dir, "--spec", path,
                                  env={"DFLASHC": self.path("no-such-dflashc")})
        self.assertEqual(status, 2)
        self.assertIn("no-such-dflashc: not an executable dflashc; set DFLASHC=none", err)

    def test_a_dflashc_that_cannot_run_is_a_warning(self):
        dflashc = fake_dflashc(self.dir, "", 1)  # fails without a word
        with mock.patch.dict(os.environ, {"DFLASHC": dflashc}):
            self.assertEqual(load_spec(self.spec_path).name, "small")


if __name__ == "__main__":
    unittest.main()
