"""serve-check's decoding loop and the exported drafter at inference, with
torch alone: a stand-in target (a small deterministic causal model that
recomputes from its tokens, so a block and one token at a time agree
exactly) and drafters written as exports (random weights) or as stubs
that propose what they are told. The transformers target runs on the GPU
machine (docs/data.md)."""
import json
import os
import unittest

import numpy as np

import helpers  # noqa: F401  (imports the checkout's dflash_prepare)
from helpers import TempDir

from dflash_prepare import shards
from dflash_prepare.errors import UserError

try:
    import torch
except ImportError:  # reported as skipped below
    torch = None

V, H, TAPS, BS, MASK = 40, 16, 2, 4, 39
STOP = 7


class StandInTarget:
    """Features of position p: tanh of the running mean of the embeddings up
    to p, through one matrix per tap; logits from the last tap. The mask
    token is never predicted."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(V, H, generator=g, dtype=torch.float64)
        self.taps = [torch.randn(H, H, generator=g, dtype=torch.float64) for _ in range(TAPS)]
        self.head = torch.randn(V, H, generator=g, dtype=torch.float64)
        self.tokens = []

    def reset(self):
        self.tokens = []

    def crop(self, length):
        self.tokens = self.tokens[:length]

    def run(self, ids):
        start = len(self.tokens)
        self.tokens = self.tokens + list(ids)
        features, logits = [], []
        total = torch.zeros(H, dtype=torch.float64)
        for p, token in enumerate(self.tokens):
            total = total + self.embed[token]
            if p < start:
                continue
            taps = [torch.tanh(m @ (total / (p + 1))) for m in self.taps]
            features.append(torch.cat(taps))
            row = self.head @ taps[-1]
            row[MASK] = -float("inf")
            logits.append(row)
        return torch.stack(logits).float(), torch.stack(features).float()


KC, GS, RANK, TOPK = 2, 4, 6, 5  # a DFlash2 drafter's convolution and selector


def write_export(directory, layer_types, seed=0, window=4, dflash2=None, rope_scaling=None):
    """An exported drafter (docs/semantics.md section 6) with random weights;
    with `dflash2` ("identity" or "random") a DFlash2 drafter (section 13)
    whose convolutions and successor codebook start as section 13 says
    (identity, S = 0) or are random too."""
    rng = np.random.default_rng(seed)
    nh, nkv, d, inter = 2, 1, 8, 32
    shapes = {"fc.weight": [H, TAPS * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(len(layer_types)):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": [H],
                       p + "post_attention_layernorm.weight": [H],
                       p + "self_attn.q_proj.weight": [nh * d, H],
                       p + "self_attn.k_proj.weight": [nkv * d, H],
                       p + "self_attn.v_proj.weight": [nkv * d, H],
                       p + "self_attn.o_proj.weight": [H, nh * d],
                       p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                       p + "mlp.gate_proj.weight": [inter, H], p + "mlp.up_proj.weight": [inter, H],
                       p + "mlp.down_proj.weight": [H, inter]})
    if dflash2:
        for i in range(len(layer_types)):
            for conv in ("attention_conv", "mlp_conv"):
                p = f"layers.{i}.{conv}."
                shapes.update({p + "base_kernel": [2, KC, H],
                               p + "kernel_projection.weight": [2 * KC * (H // GS), H]})
        shapes.update({"candidate_selector.hidden_projection.weight": [RANK, H],
                       "candidate_selector.predecessor_codebook": [V, RANK],
                       "candidate_selector.successor_codebook": [V, RANK]})
    tensors = {}
    for name, shape in shapes.items():
        values = (1 + 0.1 * rng.standard_normal(shape) if name.endswith("norm.weight")
                  else 0.3 * rng.standard_normal(shape)).astype(np.float32)
        if dflash2 == "identity" and name.endswith("base_kernel"):
            values = np.zeros(shape, np.float32)
            values[:, 0, :] = 1
        if dflash2 == "identity" and (name.endswith("kernel_projection.weight") or
                                      name.endswith("successor_codebook")):
            values = np.zeros(shape, np.float32)
        tensors[name] = shards.Tensor("BF16", shards.float32_to_bf16_bits(values))
    os.makedirs(directory, exist_ok=True)
    shards.write_shard(os.path.join(directory, "model.safetensors"), tensors)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
              "block_size": BS, "dflash_config": {"mask_token_id": MASK,
                                                  "target_layer_ids": [0, 1]},
              "hidden_size": H, "intermediate_size": inter,
              "num_hidden_layers": len(layer_types), "num_attention_heads": nh,
              "num_key_value_heads": nkv, "head_dim": d, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "vocab_size": V, "layer_types": layer_types,
              "use_sliding_window": "sliding_attention" in layer_types}
    if "sliding_attention" in layer_types:
        config["sliding_window"] = window
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
        # factor x the original positions, as exports write (some
        # transformers versions take the factor from this ratio).
        config["max_position_embeddings"] = int(
            rope_scaling["factor"] * rope_scaling.get("original_max_position_embeddings", 1))
    if dflash2:
        config["architectures"] = ["DFlash2DraftModel"]
        config["is_causal"] = False
        config["dflash_config"].update({"block_size": BS, "conv_kernel_size": KC,
                                        "conv_group_size": GS, "selector_rank": RANK,
                                        "selector_top_k": TOPK})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory


class Counting:
    """A context that only counts its positions."""

    def __init__(self):
        self.length = 0

    def append(self, features):
        self.length += len(features)


class ToldDrafter:
    """Proposes `answer(anchor)`, checking the context it is handed."""

    block_size = BS

    def __init__(self, answer):
        self.answer = answer
        self.anchors = []

    def context(self):
        return Counting()

    def propose(self, context, token, anchor):
        assert context.length == anchor, (context.length, anchor)
        self.anchors.append(anchor)
        return self.answer(anchor)


@unittest.skipIf(torch is None, "needs torch")
class ServeCheckTest(TempDir):
    def setUp(self):
        super().setUp()
        from dflash_prepare import serve_check
        self.sc = serve_check
        self.target = StandInTarget()
        self.prompts = [[1, 2, 3], [5, 9, 11, 30, 2], [20]]

    def drafter(self, layer_types, name=None, **kw):
        from dflash_prepare.drafter import Drafter
        path = write_export(self.path(name or "drafter-" + "-".join(layer_types)),
                            layer_types, **kw)
        return Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                       "cpu", torch.float32)

    def test_speculative_text_is_the_greedy_text(self):
        drafter = self.drafter(["sliding_attention", "full_attention"])
        for prompt in self.prompts:
            plain = self.sc.greedy(self.target, prompt, 40, {STOP})
            spec, blocks = self.sc.speculative(self.target, drafter, prompt, 40, {STOP})
            self.assertEqual(spec, plain)
            self.assertTrue(all(1 <= n <= BS for n in blocks), blocks)
            self.assertGreaterEqual(sum(blocks) + 1, len(spec))

    def test_a_drafter_that_knows_the_answer_gets_whole_blocks(self):
        prompt = self.prompts[1]
        plain = self.sc.greedy(self.target, prompt, 80, set())
        drafter = ToldDrafter(lambda anchor: plain[anchor - len(prompt) + 1:
                                                   anchor - len(prompt) + BS])
        spec, blocks = self.sc.speculative(self.target, drafter, prompt, 60, set())
        self.assertEqual(spec, plain[:60])
        self.assertEqual(blocks, [BS] * len(blocks))
        # Each block starts at the last kept token: 1 + 4 tokens a block.
        self.assertEqual(drafter.anchors, [len(prompt) + BS * i for i in range(len(blocks))])

    def test_position_runs_count_every_anchor_and_replay_the_served_blocks(self):
        prompt = self.prompts[1]
        P = len(prompt)
        plain = self.sc.greedy(self.target, prompt, 30, set())

        def answer(anchor):  # right at two anchors of three, wrong at the third
            return plain[anchor - P + 1:anchor - P + BS] if anchor % 3 else [MASK] * (BS - 1)
        runs = self.sc.position_runs(self.target, ToldDrafter(answer), prompt, plain)
        full = prompt + plain
        want = [min(BS, len(full) - a) if a % 3 else 1 for a in range(P, len(full) - 1)]
        self.assertEqual(runs, want)
        spec, blocks = self.sc.speculative(self.target, ToldDrafter(answer), prompt, 30, set())
        self.assertEqual(spec, plain)
        # The last block may run past the answer's end, where runs stop.
        self.assertEqual(self.sc.serving_order(runs)[:len(blocks) - 1], blocks[:-1])

    def test_a_drafter_that_is_always_wrong_gets_one_token_a_block(self):
        prompt = self.prompts[0]
        drafter = ToldDrafter(lambda anchor: [MASK] * (BS - 1))
        spec, blocks = self.sc.speculative(self.target, drafter, prompt, 30, set())
        self.assertEqual(spec, self.sc.greedy(self.target, prompt, 30, set()))
        self.assertEqual(blocks, [1] * 29)

    def test_decoding_stops_at_the_end_of_turn(self):
        prompt = self.prompts[0]
        plain = self.sc.greedy(self.target, prompt, 200, set())
        stop = plain[12]  # a token the target does produce
        cut = plain[:plain.index(stop) + 1]
        self.assertEqual(self.sc.greedy(self.target, prompt, 200, {stop}), cut)
        drafter = ToldDrafter(lambda anchor: plain[anchor - len(prompt) + 1:
                                                   anchor - len(prompt) + BS])
        spec, blocks = self.sc.speculative(self.target, drafter, prompt, 200, {stop})
        self.assertEqual(spec, cut)
        self.assertEqual(sum(blocks) + 1, len(cut))

    def logits(self, drafter, change_at, anchor=12):
        """The block's logits after the context's position `change_at` is
        changed (None: unchanged)."""
        _, features = self.target.run(list(range(1, anchor + 1)))
        self.target.reset()
        if change_at is not None:
            features = features.clone()
            features[change_at] += 1.0
        context = drafter.context()
        context.append(features[:anchor])
        return drafter.block_logits(context, 5, anchor)

    def test_a_sliding_layer_sees_only_its_window(self):
        window = 4
        sliding = self.drafter(["sliding_attention"], window=window)
        base = self.logits(sliding, None)
        # Slot 0 at anchor 12 sees 9..11, slot 3 sees 12 - 0 (its block).
        self.assertTrue(torch.equal(self.logits(sliding, 8), base))
        self.assertFalse(torch.equal(self.logits(sliding, 9), base))
        full = self.drafter(["full_attention"])
        self.assertFalse(torch.equal(self.logits(full, 0), self.logits(full, None)))

    def test_the_context_must_end_at_the_anchor(self):
        drafter = self.drafter(["full_attention"])
        context = drafter.context()
        context.append(torch.randn(5, TAPS * H))
        with self.assertRaises(ValueError):
            drafter.propose(context, 1, 6)
        self.assertEqual(len(drafter.propose(context, 1, 5)), BS - 1)

    def test_yarn_rotates_as_section_14_says(self):
        # d 8, theta 1e4, 16 original positions: only frequency 0 turns 32
        # times within them (kept); 1..3 turn less than once (divided by 4).
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
        drafter = self.drafter(["full_attention"], name="yarn", rope_scaling=yarn)
        base = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
        want = torch.cat([base[:1], base[1:] / 4])
        self.assertTrue(torch.allclose(drafter.inverse_frequencies, want, rtol=1e-6))
        self.assertAlmostEqual(drafter.attention_factor, 0.1 * np.log(4.0) + 1.0)
        plain = self.drafter(["full_attention"], name="plain")
        self.assertTrue(torch.allclose(plain.inverse_frequencies, base))
        try:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            from transformers import Qwen3Config
        except ImportError:  # the GPU machine has transformers
            return
        with open(os.path.join(self.path("yarn"), "config.json")) as f:
            config = Qwen3Config(**json.load(f))
        inverse, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        self.assertTrue(torch.allclose(drafter.inverse_frequencies, inverse.float(), rtol=1e-6))
        self.assertAlmostEqual(drafter.attention_factor, float(factor), places=6)

    def test_an_unknown_rope_type_is_named(self):
        from dflash_prepare.drafter import Drafter
        path = write_export(self.path("dynamic"), ["full_attention"],
                            rope_scaling={"rope_type": "dynamic", "factor": 2.0})
        with self.assertRaisesRegex(UserError, "rope_scaling.rope_type 'dynamic'"):
            Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                    "cpu", torch.float32)

    def test_a_bad_export_is_named(self):
        from dflash_prepare.drafter import Drafter
        path = write_export(self.path("bad"), ["full_attention"])
        weights = shards.SafetensorsFile(os.path.join(path, "model.safetensors"))
        kept = {n: shards.Tensor(weights.tensors[n].dtype, weights.load(n))
                for n in weights.tensors if n != "layers.0.mlp.up_proj.weight"}
        shards.write_shard(os.path.join(path, "model.safetensors"), kept)
        with self.assertRaisesRegex(UserError, "model.safetensors: has no tensor "
                                    "'layers.0.mlp.up_proj.weight'"):
            Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                    "cpu", torch.float32)
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config["architectures"] = ["Qwen3ForCausalLM"]
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        with self.assertRaisesRegex(UserError, "not an exported DFlash drafter"):
            Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                    "cpu", torch.float32)


@unittest.skipIf(torch is None, "needs torch")
class DFlash2DrafterTest(TempDir):
    """A DFlash2 export (docs/semantics.md section 13) drafting by its
    selector's greedy walk, checked against the section's formulas written
    out here in float64."""

    def setUp(self):
        super().setUp()
        self.target = StandInTarget()

    def drafter(self, name, layer_types, **kw):
        from dflash_prepare.drafter import Drafter
        path = write_export(self.path(name), layer_types, **kw)
        return Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                       "cpu", torch.float64)

    def context(self, drafter, anchor):
        self.target.reset()
        _, features = self.target.run(list(range(1, anchor + 1)))
        context = drafter.context()
        context.append(features[:anchor].double())
        return context

    def test_at_initialisation_it_drafts_as_the_same_v1_drafter(self):
        # Identity convolutions and S = 0: the scores are the unary logits,
        # so the walk picks their argmax (full layers see the whole block
        # either way).
        layers = ["full_attention", "full_attention"]
        v1 = self.drafter("v1", layers, seed=3)
        v2 = self.drafter("v2", layers, seed=3, dflash2="identity")
        for anchor in (5, 9):
            self.assertEqual(v2.propose(self.context(v2, anchor), 4, anchor),
                             v1.propose(self.context(v1, anchor), 4, anchor))
        # A random convolution changes the block.
        v2r = self.drafter("v2r", layers, seed=3, dflash2="random")
        self.assertFalse(torch.equal(v2r.block_logits(self.context(v2r, 9), 4, 9),
                                     v2.block_logits(self.context(v2, 9), 4, 9)))

    def test_the_convolution_is_section_13s(self):
        d = self.drafter("conv", ["full_attention"], dflash2="random")
        g = torch.Generator().manual_seed(1)
        x = torch.randn(BS, H, generator=g, dtype=torch.float64)
        delta = torch.randn(BS, KC, H // GS, generator=g, dtype=torch.float64)
        base = torch.randn(KC, H, generator=g, dtype=torch.float64)
        want = torch.zeros(BS, H, dtype=torch.float64)
        for k in range(BS):
            for c in range(H):
                for o in range(KC):
                    if k - o >= 0:
                        want[k, c] += (base[o, c] + delta[k, o, c // GS]) * x[k - o, c]
        self.assertLess(float((d.conv(x, delta, base) - want).norm() / want.norm()), 1e-12)

    def test_the_walk_reranks_the_top_k_with_each_slots_predecessor(self):
        d = self.drafter("walk", ["sliding_attention", "full_attention"], dflash2="random")
        anchor, token = 10, 6
        d.successor_codebook *= 30  # large enough to overturn the unary order
        context = self.context(d, anchor)
        y = d.block_hidden(context, token, anchor)[1:]
        u = y @ d.lm_head.T
        chosen, predecessor = [], token
        for k in range(BS - 1):
            candidates = sorted(range(V), key=lambda v: -float(u[k, v]))[:TOPK]
            t = d.hidden_projection @ y[k]
            z = d.predecessor_codebook[predecessor] * t
            scores = [float(u[k, c] + d.successor_codebook[c] @ z) for c in candidates]
            predecessor = candidates[max(range(TOPK), key=lambda j: scores[j])]
            chosen.append(predecessor)
        self.assertEqual(d.propose(context, token, anchor), chosen)
        # The selector does re-rank here: not every pick is the unary argmax.
        self.assertNotEqual(chosen, u.argmax(-1).tolist())

    def test_every_layer_sees_its_whole_block(self):
        d = self.drafter("bidirectional", ["sliding_attention"], dflash2="identity")
        visible = d.visible(4, 12)
        self.assertTrue(bool(visible[:, 12:].all()))
        v1 = self.drafter("causal", ["sliding_attention"])
        self.assertFalse(bool(v1.visible(4, 12)[:, 12:].all()))

    def test_a_dflash2_export_without_its_selector_is_named(self):
        from dflash_prepare.drafter import Drafter
        path = write_export(self.path("bad2"), ["full_attention"], dflash2="random")
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        del config["dflash_config"]["selector_top_k"]
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        with self.assertRaisesRegex(UserError, "has no 'dflash_config.selector_top_k'"):
            Drafter(path, self.target.embed.float(), self.target.head.float(), torch,
                    "cpu", torch.float32)


if __name__ == "__main__":
    unittest.main()
