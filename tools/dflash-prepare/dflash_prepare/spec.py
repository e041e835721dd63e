"""The few drafter-spec fields the data tools need (docs/spec.md).

dflashc is the authority on a spec; this reader takes only the keys that fix
the data's shapes and checks them as far as the data depends on them.
test/Prepare/spec-contract.test holds every field here, defaults included,
to what `dflashc SPEC --emit=spec` resolves.
"""
import dataclasses
from fractions import Fraction

from .errors import UserError


@dataclasses.dataclass
class Spec:
    path: str
    name: str
    target_model: str
    target_num_layers: int
    hidden_size: int
    vocab_size: int
    layer_ids: list
    layer_ids_defaulted: bool
    drafter_num_layers: int
    mask_token_id: int
    block_size: int
    seq_len: int
    anchors_per_row: int
    tie_word_embeddings: bool

    @property
    def context_width(self):
        """L*H: the width of one row of `hidden_states`."""
        return len(self.layer_ids) * self.hidden_size

    def layer_ids_text(self):
        """`target_layer_ids` as the C++ runtime writes and compares it."""
        return "[" + ", ".join(str(i) for i in self.layer_ids) + "]"

    def shard_metadata(self):
        """The `__metadata__` fields the trainer checks against its spec."""
        return {
            "target": self.target_model,
            "target_layer_ids": self.layer_ids_text(),
            "hidden_size": str(self.hidden_size),
            "seq_len": str(self.seq_len),
        }


def default_layer_ids(num_target, num_draft):
    """docs/semantics.md section 7: round_half_even(1 + i*(n-4)/(k-1)), exact."""
    if num_draft == 1:
        return [num_target // 2]
    return [round(1 + Fraction(i * (num_target - 4), num_draft - 1))
            for i in range(num_draft)]


def _load_toml(path):
    try:
        import tomllib
    except ImportError:
        raise UserError("reading a spec needs python >= 3.11 (tomllib)") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: cannot open spec file: no such file") from None
    except OSError as error:
        raise UserError(f"{path}: cannot open spec file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: invalid toml: {error}") from None


def load_spec(path):
    data = _load_toml(path)

    def field(table, key, kind, default=None, required=False):
        section = data.get(table, {}) if table else data
        name = f"{table}.{key}" if table else key
        if not isinstance(section, dict):
            raise UserError(f"{path}: '{table}' is not a table")
        if key not in section:
            if required:
                raise UserError(f"{path}: '{name}' is missing")
            return default
        value = section[key]
        ok = (isinstance(value, kind) and not
              (kind is int and isinstance(value, bool)))
        if not ok:
            raise UserError(
                f"{path}: '{name}' is {value!r}, not {kind.__name__}")
        return value

    name = field(None, "name", str, required=True)
    target_model = field("target", "model", str, "")
    num_target = field("target", "num_layers", int, required=True)
    hidden = field("target", "hidden_size", int, required=True)
    vocab = field("target", "vocab_size", int, required=True)
    tied = field("target", "tie_word_embeddings", bool, False)
    num_draft = field("drafter", "num_layers", int, required=True)
    mask = field("drafter", "mask_token_id", int, required=True)
    block = field("drafter", "block_size", int, required=True)
    seq_len = field("training", "seq_len", int, 3072)
    anchors = field("training", "anchors_per_row", int, 512)
    ids = field("target", "layer_ids", list, None)
    defaulted = ids is None
    if defaulted:
        ids = default_layer_ids(num_target, num_draft)

    for key, value, least in (("target.num_layers", num_target, 1),
                              ("target.hidden_size", hidden, 1),
                              ("target.vocab_size", vocab, 2),
                              ("drafter.block_size", block, 2),
                              ("training.seq_len", seq_len, 2),
                              ("training.anchors_per_row", anchors, 1)):
        if value < least:
            raise UserError(f"{path}: '{key}' is {value}; it must be >= {least}")
    if not 0 <= mask < vocab:
        raise UserError(f"{path}: 'drafter.mask_token_id' is {mask}, outside "
                        f"the vocabulary [0, {vocab}) of 'target.vocab_size'")
    if not ids or any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise UserError(f"{path}: 'target.layer_ids' must be a non-empty list "
                        f"of integers")
    for i, layer in enumerate(ids):
        if not 0 <= layer < num_target or (i and layer <= ids[i - 1]):
            what = "default taps (spread rule)" if defaulted else "'target.layer_ids'"
            raise UserError(
                f"{path}: {what} {ids} are not strictly ascending layers in "
                f"[0, {num_target})")
    return Spec(path=path, name=name, target_model=target_model,
                target_num_layers=num_target, hidden_size=hidden,
                vocab_size=vocab, layer_ids=list(ids),
                layer_ids_defaulted=defaulted, drafter_num_layers=num_draft,
                mask_token_id=mask, block_size=block, seq_len=seq_len,
                anchors_per_row=anchors, tie_word_embeddings=tied)
