"""`dflash-prepare features`: token shards -> feature shards, with the
Hugging Face target.

Each conversation of a row runs alone through the target (positions from 0,
nothing of another conversation visible), in bf16, and the residual stream
after each tapped layer `l` is read at `hidden_states[l + 1]` (index 0 is
the embedding output), concatenated in `target_layer_ids` order. The last
layer's entry there is after the final norm, so a tap of the last layer is
read from that layer's own output instead (docs/semantics.md: residual streams). Padding
stays zero. Conversations of similar length run together in a batch,
right-padded: with causal attention a real token never sees the padding
after it, so that is the same as running each alone.
"""
import json
import os
import shutil
import sys
import time

import numpy as np

from . import check, output_lock, packing, progress, shards
from .errors import UserError, note, require, require_torch2, warn
from .spec import load_spec

FORMAT = "dflash-feature-shard"


def read_target_config(directory, spec):
    """The target's config.json, checked against the spec without loading
    the model: hidden size, vocabulary, layer count and tying must agree.
    The same checks, in the same order and naming the same fields, as
    dflashc's (compiler/Import/TargetConfig.cpp, checkTargetAgainstSpec);
    test/Prepare/target-config-contract.test holds the two together."""
    path = os.path.join(directory, "config.json")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory}: not a directory (--target is a Hugging Face model "
                        "directory)")
    if not os.path.isdir(directory):
        raise UserError(f"{directory}: target directory does not exist")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (a Hugging Face model directory "
                        "has one)") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: unreadable: {error}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a json object")
    # Multimodal targets keep the language model's fields in text_config.
    text, prefix = config, ""
    if isinstance(config.get("text_config"), dict):
        text, prefix = config["text_config"], "text_config."

    def integer(key):
        value = text.get(key)
        if value is None:
            raise UserError(f"{path}: has no '{prefix}{key}'")
        # json has one number type: 4096.0 is the integer 4096, as for dflashc.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{path}: '{prefix}{key}' is {json.dumps(value)}, "
                            "not an integer")
        return value

    values = {key: integer(key)
              for key in ("hidden_size", "num_hidden_layers", "vocab_size")}
    # Absent or null: untied, the default of dflashc and of the Qwen3 and
    # Llama configs of transformers.
    tied = text.get("tie_word_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise UserError(f"{path}: '{prefix}tie_word_embeddings' is "
                        f"{json.dumps(tied)}, not true or false")
    checks = (("hidden_size", spec.hidden_size, "hidden_size"),
              ("vocab_size", spec.vocab_size, "vocab_size"),
              ("num_hidden_layers", spec.target_num_layers, "num_layers"))
    for key, expected, spec_key in checks:
        if values[key] != expected:
            raise UserError(f"{path}: '{key}' is {values[key]} but {spec.path} "
                            f"[target] {spec_key} is {expected}")
    if bool(tied) != spec.tie_word_embeddings:
        shown = json.dumps(bool(tied)) + (" (absent)" if tied is None else "")
        raise UserError(f"{path}: 'tie_word_embeddings' is {shown} but {spec.path} "
                        f"[target] tie_word_embeddings is "
                        f"{json.dumps(spec.tie_word_embeddings)}")
    # The target's features at every position of a row: past its trained
    # range (with the rope_scaling it is served with) they are not its own.
    if text.get("max_position_embeddings") is not None:
        positions = integer("max_position_embeddings")
        if positions <= 0:
            raise UserError(f"{path}: '{prefix}max_position_embeddings' must be positive, "
                            f"got {positions}")
        if spec.seq_len > positions:
            raise UserError(
                f"{path}: 'max_position_embeddings' is {positions} but {spec.path} "
                f"[training] seq_len is {spec.seq_len}: its features past that position "
                "would not be the served target's; give its config.json the rope_scaling "
                "it is served with (Qwen3 reaches 131072 positions with YaRN, factor 4 "
                "over 32768, and max_position_embeddings 131072), or train shorter rows")
    return config


def feature_row_bytes(spec, packed):
    S = spec.seq_len
    return S * spec.context_width * 2 + S * 4 + S + 4 + (S * 4 if packed else 0)


def check_disk(directory, needed):
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise UserError(f"{directory}: the feature shards need about "
                        f"{_size(needed)} but its filesystem has {_size(free)} free")
    return free


def _size(count):
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


class TokenRows:
    """The rows of a token shard directory, addressed by one global index."""

    def __init__(self, paths):
        self.files = [shards.SafetensorsFile(p) for p in paths]
        self.index = []
        for f, shard in enumerate(self.files):
            for r in range(shard.tensors["input_ids"].shape[0]):
                self.index.append((f, r))
        self.packed = all("position_ids" in s.tensors for s in self.files)
        if not self.packed and any("position_ids" in s.tensors for s in self.files):
            raise UserError(f"{os.path.dirname(paths[0])}: some token shards are "
                            "packed (position_ids) and some are not")

    def __len__(self):
        return len(self.index)

    def row(self, index):
        f, r = self.index[index]
        shard = self.files[f]
        ids = np.array(shard.array("input_ids")[r])
        mask = np.array(shard.array("loss_mask")[r])
        S = len(ids)
        n = int(shard.array("num_tokens")[r]) if "num_tokens" in shard.tensors else S
        if "position_ids" in shard.tensors:
            positions = np.array(shard.array("position_ids")[r])
        else:
            positions = np.arange(S, dtype=np.int32)  # one conversation
        return ids, mask, positions, n

    def where(self, index):
        f, r = self.index[index]
        return f"{self.files[f].path} row {r}"

    def metadata(self):
        return dict(self.files[0].metadata)


def capture_last_layer(body):
    """Hooks the last decoder layer of `body` (its `layers`): the returned
    dict holds its output (the residual stream) under "out" after each
    forward pass; the handle removes the hook."""
    layers = getattr(body, "layers", None)
    if layers is None or len(layers) == 0:
        raise UserError("the target's decoder has no `layers` to read the last "
                        "tapped layer from")
    held = {}

    def hook(module, inputs, output):
        held["out"] = output[0] if isinstance(output, tuple) else output

    return held, layers[-1].register_forward_hook(hook)


def tapped_states(states, layer_ids, num_layers, last_output):
    """The residual stream after each tapped layer: hidden_states[l + 1],
    except the last layer's, which is `last_output` (transformers' last
    entry is after the final norm)."""
    taps = []
    for l in layer_ids:
        if l == num_layers - 1:
            if last_output is None:
                raise UserError(f"layer {l} is tapped but its output was not captured")
            taps.append(last_output)
        else:
            taps.append(states[l + 1])
    return taps


class FeatureExtractor:
    def __init__(self, directory, spec, device, batch_tokens):
        self.torch = require_torch2("computing target features")
        transformers = require("transformers", "computing target features")
        torch = self.torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {device}: torch sees no CUDA device")
        self.device = torch.device(device)
        try:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    directory, dtype=torch.bfloat16, local_files_only=True)
            except TypeError:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    directory, torch_dtype=torch.bfloat16, local_files_only=True)
        except Exception as error:  # transformers raises many kinds here
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(f"{directory}: cannot load the target model: {first}") from None
        # Device only: a model-wide dtype cast would also make fp32 buffers
        # such as RoPE's inv_freq bf16 and move every position's angles.
        if next(model.parameters()).dtype != torch.bfloat16:
            model = model.to(torch.bfloat16)  # a transformers that ignored dtype=
        model = model.to(device=self.device).eval()
        # The decoder alone: the lm_head's [tokens, V] logits are not needed.
        self.body = model.model if isinstance(getattr(model, "model", None),
                                              torch.nn.Module) else model
        self.layer_ids = spec.layer_ids
        self.num_layers = spec.target_num_layers
        self.last = {}
        if self.num_layers - 1 in self.layer_ids:
            self.last, _ = capture_last_layer(self.body)
        self.width = spec.context_width
        self.batch_tokens = batch_tokens

    def _batches(self, segments):
        order = sorted(range(len(segments)), key=lambda i: -segments[i][2])
        batch, longest = [], 0
        for i in order:
            n = segments[i][2]
            if batch and max(longest, n) * (len(batch) + 1) > self.batch_tokens:
                yield batch
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        if batch:
            yield batch

    def run(self, token_rows, ids, out, bad):
        """Fills `out` [rows, S, L*H] (uint16 bf16 bits, zeros) with the
        features of the rows `ids` of `token_rows`; adds the local index of
        each row with a non-finite feature to `bad`."""
        torch = self.torch
        segments = []  # (local row, start, length, ids)
        for local, index in enumerate(ids):
            row_ids, _, positions, n = token_rows.row(index)
            for start, end in packing.conversation_bounds(positions, n):
                segments.append((local, start, end - start, row_ids[start:end]))
        with torch.inference_mode():
            for batch in self._batches(segments):
                longest = max(segments[i][2] for i in batch)
                tokens = torch.zeros((len(batch), longest), dtype=torch.long)
                attention = torch.zeros((len(batch), longest), dtype=torch.long)
                for b, i in enumerate(batch):
                    n = segments[i][2]
                    tokens[b, :n] = torch.from_numpy(segments[i][3].astype(np.int64))
                    attention[b, :n] = 1
                # No position_ids: the model's own are arange(length), from
                # 0 for each conversation (right padding comes after), and
                # given ones would make transformers look for packed
                # sequences and take another attention path.
                result = self.body(
                    input_ids=tokens.to(self.device),
                    attention_mask=None if len(batch) == 1 else attention.to(self.device),
                    output_hidden_states=True, use_cache=False, return_dict=True)
                states = result.hidden_states
                if len(states) != self.num_layers + 1:
                    raise UserError(f"the target returned {len(states)} hidden "
                                    f"states, not num_layers + 1 = {self.num_layers + 1}")
                taps = torch.cat(tapped_states(states, self.layer_ids, self.num_layers,
                                               self.last.get("out")), dim=-1)
                taps = taps.to(torch.bfloat16)
                finite = torch.isfinite(taps).all(dim=-1).cpu().numpy()  # [batch, tokens]
                bits = taps.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
                for b, i in enumerate(batch):
                    local, start, n, _ = segments[i]
                    if not finite[b, :n].all():
                        bad.add(local)
                    out[local, start:start + n] = bits[b, :n]


def run(args):
    spec = load_spec(args.spec)
    paths = shards.list_shards(args.tokens)
    if not paths:
        raise UserError(f"{args.tokens}: has no *.safetensors token shards")
    if os.path.abspath(args.tokens) == os.path.abspath(args.out):
        raise UserError(f"--out {args.out}: must not be the token directory")
    result = check.check_paths(paths, spec, expect="tokens")
    if result.problems:
        check.print_problems(result, sys.stderr)
        raise UserError(f"{args.tokens}: {len(result.bad_rows)} bad row(s) and "
                        f"{len(result.bad_files)} bad file(s) in the token shards; "
                        "fix them first (dflash-prepare check)")
    target_config = read_target_config(args.target, spec)
    token_rows = TokenRows(paths)
    total = len(token_rows)
    row_bytes = feature_row_bytes(spec, token_rows.packed)
    per_shard = args.rows_per_shard or max(1, (1 << 30) // row_bytes)
    count = (total + per_shard - 1) // per_shard

    identity = {
        "tokens": [progress.file_identity(p) for p in paths],
        "target": os.path.abspath(args.target),
        "target_config": target_config,
        "target_files": sorted(
            [n, os.path.getsize(os.path.join(args.target, n))]
            for n in os.listdir(args.target) if n.endswith(".safetensors") or n.endswith(".bin")),
        "spec": spec.shard_metadata(),
        "rows_per_shard": per_shard,
    }
    with output_lock.DirectoryLock(args.out, "features"):
        return _run_locked(args, spec, paths, token_rows, total, row_bytes, per_shard,
                           count, identity)


def _run_locked(args, spec, paths, token_rows, total, row_bytes, per_shard, count,
                identity):
    """The run once it holds --out's lock: no other run writes there."""
    manifest = progress.Manifest(args.out, "features", progress.fingerprint(identity),
                                 args.overwrite)
    if manifest.complete:
        note(f"{args.out}: already complete ({len(manifest.shards)} shards); nothing to do")
        print(f"features: {args.out}: complete, {len(manifest.shards)} shards")
        return 0
    manifest.planned = count
    with progress.stopping_cleanly(manifest):
        return _write_features(args, spec, manifest, token_rows, per_shard, row_bytes)


def _write_features(args, spec, manifest, token_rows, per_shard, row_bytes):
    """The run once its output directory is open: load the target, write
    the shards not yet written."""
    total, count = len(token_rows), manifest.planned
    pending = [k for k in range(count) if not manifest.done(shards.shard_name(k))]
    pending_rows = sum(min(total, (k + 1) * per_shard) - k * per_shard for k in pending)
    needed = pending_rows * row_bytes + len(pending) * (1 << 16)
    free = check_disk(args.out, needed)
    note(f"{total} rows in {len(token_rows.files)} token shard(s) -> {count} feature "
         f"shard(s) of up to {per_shard} rows; {len(pending)} to write, about {_size(needed)} "
         f"({_size(row_bytes)} a row), {_size(free)} free")

    extractor = FeatureExtractor(args.target, spec, args.device, args.batch_tokens)
    if extractor.device.type == "cpu":
        warn("computing features on the CPU (no CUDA device): slow for a real target")
    meta = token_rows.metadata()
    meta.update(spec.shard_metadata())
    meta.update({"format": FORMAT, "format_version": "1", "spec": spec.name,
                 "target_dir": os.path.abspath(args.target)})
    S, width = spec.seq_len, spec.context_width
    written, started = 0, time.time()
    for k in pending:
        name = shards.shard_name(k)
        rows = list(range(k * per_shard, min(total, (k + 1) * per_shard)))
        hidden = np.zeros((len(rows), S, width), dtype=np.uint16)
        bad = set()
        extractor.run(token_rows, rows, hidden, bad)
        keep = [i for i in range(len(rows)) if i not in bad]
        for i in sorted(bad):
            warn(f"skipped {token_rows.where(rows[i])}: non-finite target features")
        if not keep:
            # Nothing to write: recorded so that a resumed run skips it too.
            manifest.record(name, {"rows": 0, "first_row": rows[0], "skipped": len(bad),
                                   "bytes": 0, "empty": True})
            continue
        loaded = [token_rows.row(index) for index in rows]
        tensors = {
            "input_ids": shards.Tensor("I32", np.stack([r[0] for r in loaded])),
            "loss_mask": shards.Tensor("U8", np.stack([r[1] for r in loaded])),
            "num_tokens": shards.Tensor("I32", np.array([r[3] for r in loaded])),
            "hidden_states": shards.Tensor("BF16", hidden),
        }
        if token_rows.packed:
            tensors["position_ids"] = shards.Tensor("I32", np.stack([r[2] for r in loaded]))
        size = shards.write_shard(
            os.path.join(args.out, name), tensors,
            dict(meta, first_row=str(rows[0]),
                 skipped_rows=json.dumps(sorted(rows[i] for i in bad))),
            rows=keep)
        manifest.record(name, {"rows": len(keep), "first_row": rows[0],
                               "skipped": len(bad), "bytes": size,
                               "skipped_rows": [token_rows.where(rows[i]) for i in sorted(bad)]})
        written += 1
        elapsed = time.time() - started
        note(f"{name}: {len(keep)} rows ({len(bad)} skipped), {written}/{len(pending)} "
             f"shards, {elapsed:.0f} s")
    kept_rows = sum(e["rows"] for e in manifest.shards.values())
    skipped_total = sum(e.get("skipped", 0) for e in manifest.shards.values())
    manifest.save(complete=True, report={"rows": kept_rows, "skipped_non_finite": skipped_total,
                                         "shards": count})
    note(f"wrote {written} feature shard(s), {kept_rows} rows in all; skipped "
         f"{skipped_total} row(s) with non-finite features")
    print(f"features: {args.out}: {kept_rows} rows in {count} shards, "
          f"{skipped_total} skipped (non-finite)")
    return 0
