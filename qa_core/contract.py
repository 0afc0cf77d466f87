"""The facts every part of the product must agree on (torch-free): special token ids, segment ids, the
model's input names and output names per head (from the head registry), and the inference settings'
defaults.

Training, export, the server and the benchmarks import them from here; a checkpoint's metadata and an
export's sidecar record the settings a model was trained with, and these defaults apply only where a
model does not say (BERT's run_squad.py windows and decoding; the original XLNet's are the preset in
train/recipes/presets.py: 512-token windows, answers up to 64 tokens, n-best 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from qa_core.heads import REGISTRY, head_spec

# Special ids, exactly as the original XLNet sentencepiece models lay them out (and HF's xlnet-*-cased).
UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
CLS_ID = 3
SEP_ID = 4
PAD_ID = 5
MASK_ID = 6
EOD_ID = 7
EOP_ID = 8

# Segment (token type) ids of the SQuAD layout `paragraph <sep> question <sep> <cls>` (run_squad.py):
# A = the paragraph, B = the question, then <cls>, then padding.
SEG_ID_A = SEG_ID_PARAGRAPH = 0
SEG_ID_B = SEG_ID_QUESTION = 1
SEG_ID_CLS = 2
SEG_ID_PAD = 3
NUM_SEGMENT_IDS = 4

# The fused inference layer's query and key columns per head (train.model.fused): d_head, a bias column,
# the segment one-hot, padded to a multiple of 8 (64 -> 72).
FUSED_COLUMN_MULTIPLE = 8


def fused_head_width(d_head: int) -> int:
    """Columns of a head's extended query and key in the fused layer."""
    need = d_head + NUM_SEGMENT_IDS + 1
    return -(-need // FUSED_COLUMN_MULTIPLE) * FUSED_COLUMN_MULTIPLE


# The beam head keeps this many starts, then ends per start (the original's start_n_top / end_n_top).
START_N_TOP = 5
END_N_TOP = 5
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# Each head's outputs, read from the head registry (qa_core/heads.py), the only list of heads.
OUTPUT_NAMES: dict[str, tuple[str, ...]] = {name: spec.outputs for name, spec in REGISTRY.items()}
INDEX_OUTPUTS = ("start_top_index", "end_top_index")  # token positions: compared by equality, int64
TOKEN_OUTPUTS = ("start_logits", "end_logits")  # one value per token, [B, T]; every other output is [B, ...]


# The fewest tokens an exported graph runs on whatever its head: its position term is computed in this
# many query chunks (train.model.fused.POSITION_CHUNKS), and a chunk of no rows is a reshape the
# runtimes refuse (ONNX reads a 0 in a shape as "copy this dimension"). A shorter window is padded to
# it (the padding is masked: the real tokens' outputs do not change), by the server and by the backends.
GRAPH_MIN_TOKENS = 4


def shortest_sequence(head: str, start_n_top: int, end_n_top: int) -> int:
    """The fewest tokens an exported graph of ``head`` runs on: `GRAPH_MIN_TOKENS`, or more where the
    head takes top-k inside the graph (see HeadSpec.shortest_sequence)."""
    return max(GRAPH_MIN_TOKENS, head_spec(head).shortest_sequence(start_n_top, end_n_top))


# A window holds the question, two <sep>, <cls> and at least one paragraph token.
WINDOW_OVERHEAD = 4


def window_problems(max_seq_len: int, max_query_len: int) -> list[str]:
    """What is wrong with these window sizes (positive integers assumed), one line each; [] if nothing.
    A stride longer than the window is not wrong: the windows then do not overlap, and no token is skipped
    (each next window starts at most a window further)."""
    if max_query_len + WINDOW_OVERHEAD > max_seq_len:
        return [
            f"max_seq_len={max_seq_len} leaves no room for the paragraph with max_query_len={max_query_len} "
            f"(needs max_seq_len >= max_query_len + {WINDOW_OVERHEAD})"
        ]
    return []


def _lossless(value: Any, kind: type) -> Any:
    """A recorded value as ``kind`` where nothing is lost (384.0 -> 384, "0.4" -> 0.4, as older metadata
    and hand-written files hold them); anything else as it is, for `ModelSettings.problems` to name."""
    if isinstance(value, bool):
        return value
    try:
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if kind is int and isinstance(value, str) and value.strip().isdigit():
            return int(value)
        if kind is float and isinstance(value, (int, str)):
            return float(value)
    except ValueError:
        pass
    return value


def positive_int(value: object) -> bool:
    """An int >= 1 (not a bool): what every count and length in a model's settings must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def probability(value: object) -> bool:
    """A number in [0, 1] (not a bool, not NaN): what every threshold on P(no answer) must be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


# The most candidate spans a model may keep per question: decoding pairs n-best starts with n-best ends
# in every window, so a model file recording a huge n_best would make each question cost that squared.
MAX_N_BEST = 100
HELP = "help"  # a setting's field metadata: its one help text, which every command's flag shows


@dataclass(frozen=True)
class ModelSettings:
    """How a model's questions are windowed and its answers decoded: the one type of these settings.

    Fine-tuning writes them into the checkpoint's ``metadata.json`` (`as_dict`), the exporter copies
    them into ``export.json``, and every reader (evaluation, export, the server's model spec) reads them
    with `from_metadata`, where a key the model does not record takes the default: BERT's run_squad.py
    (384/128/64, answers up to 30 tokens, n-best 20), not the original XLNet's (see the module docstring).
    """

    max_seq_len: int = field(default=384, metadata={HELP: "window length in tokens (512 allowed)"})
    doc_stride: int = field(default=128, metadata={HELP: "stride between the windows of a long paragraph"})
    max_query_len: int = field(default=64, metadata={HELP: "question tokens kept"})
    max_answer_len: int = field(default=30, metadata={HELP: "longest answer in tokens"})
    n_best: int = field(default=20, metadata={HELP: "candidate spans kept per question when decoding"})
    no_answer_threshold: float = field(
        default=0.5,
        metadata={HELP: "P(no answer) above which a question is unanswerable, where no rule is fitted"},
    )

    def as_dict(self) -> dict[str, float | int]:
        """The settings by field name: the keys fine-tuning records in ``metadata.json``."""
        return asdict(self)

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line each ([] if nothing)."""
        ints = ("max_seq_len", "doc_stride", "max_query_len", "max_answer_len", "n_best")
        found = [
            f"{n} must be a positive integer, got {getattr(self, n)!r}"
            for n in ints
            if not positive_int(getattr(self, n))
        ]
        if positive_int(self.n_best) and self.n_best > MAX_N_BEST:
            found.append(f"n_best must be at most {MAX_N_BEST}, got {self.n_best}")
        thr = self.no_answer_threshold
        if not probability(thr):
            found.append(f"no_answer_threshold must be a probability in [0, 1], got {thr!r}")
        if positive_int(self.max_seq_len) and positive_int(self.max_query_len):
            found += window_problems(self.max_seq_len, self.max_query_len)
        return found

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None, **overrides: Any) -> ModelSettings:
        """The settings a checkpoint's metadata (or an export's sidecar) records, defaults for the keys it
        does not, then ``overrides`` that are not None (command-line flags); ValueError naming every
        problem."""
        given = {f.name: (metadata or {}).get(f.name) for f in fields(cls)}
        given.update({k: v for k, v in overrides.items() if v is not None})
        if unknown := set(overrides) - {f.name for f in fields(cls)}:
            raise TypeError(f"unknown settings {sorted(unknown)}")
        kinds = {f.name: type(f.default) for f in fields(cls)}
        settings = cls(**{k: _lossless(v, kinds[k]) for k, v in given.items() if v is not None})
        if found := settings.problems():
            raise ValueError("; ".join(found))
        return settings


DEFAULTS = ModelSettings()
# The settings a model is windowed and decoded with: all but the no-answer threshold, which fine-tuning
# fits, --threshold replaces together with the decision rule, and an ensemble refits.
WINDOW_AND_DECODING = tuple(f.name for f in fields(ModelSettings) if f.name != "no_answer_threshold")
