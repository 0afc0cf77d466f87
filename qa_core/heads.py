"""The QA heads, in one registry (torch-free): each head's exported outputs, how those outputs become
an answer, and what it asks of the inputs.

The model's modules (`train/model/heads.py`, one builder per entry), the exporter's output names, the
decoding switch (`qa_core/squad/head_outputs.py`), evaluation, ensembles and the server all read this
table, so adding a head is an entry here plus its modules there.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a head's outputs become an answer:
# "spans": per-token start and end logits, paired into spans while decoding (ensembles can average them);
# "beam":  top-k starts and, per start, top-k ends chosen inside the graph (the original XLNet head).
DECODERS = ("spans", "beam")


@dataclass(frozen=True)
class HeadSpec:
    """One QA head as every part outside the model sees it."""

    name: str
    outputs: tuple[str, ...]  # the exported graph's outputs, in order
    decoder: str  # one of DECODERS
    architecture: str  # the class name a checkpoint's config.json records (HF's for simple and beam)

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ValueError(f"head {self.name!r}: decoder must be one of {DECODERS}, got {self.decoder!r}")

    @property
    def has_answerability_output(self) -> bool:
        """Whether the head scores "unanswerable" itself (`cls_logits`); if not, the null span's score
        (BERT's rule) stands in for it."""
        return "cls_logits" in self.outputs

    @property
    def masks_in_graph(self) -> bool:
        """The beam head takes top-k over allowed positions inside the graph, so the exported model
        derives the answer mask (p_mask) from its inputs; span heads are masked while decoding."""
        return self.decoder == "beam"

    @property
    def averageable(self) -> bool:
        """Whether an ensemble can average members' outputs window by window (top-k lists cannot)."""
        return self.decoder == "spans"

    def shortest_sequence(self, start_n_top: int, end_n_top: int) -> int:
        """The fewest tokens an exported graph runs on: top-k inside the graph needs k tokens, so an
        engine profile or a TensorRT provider profile must start there, not at 1."""
        return max(start_n_top, end_n_top) if self.decoder == "beam" else 1


_SPANS = ("start_logits", "end_logits")
REGISTRY: dict[str, HeadSpec] = {
    spec.name: spec
    for spec in (
        # One Linear(d, 2) for start/end: HF's XLNetForQuestionAnsweringSimple.
        HeadSpec("simple", _SPANS, "spans", "XLNetForQuestionAnsweringSimple"),
        # Start/end/answerability each one Linear(d, 1); answerability reads <cls>.
        HeadSpec("shallow", (*_SPANS, "cls_logits"), "spans", "XLNetQAShallow"),
        # MLP start/end/answerability heads (the CS224N/CS293S project heads).
        HeadSpec("deep", (*_SPANS, "cls_logits"), "spans", "XLNetQADeep"),
        # The original XLNet head (HF's XLNetForQuestionAnswering): ends conditioned on the start.
        HeadSpec(
            "beam",
            ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index", "cls_logits"),
            "beam",
            "XLNetForQuestionAnswering",
        ),
    )
}
HEADS = tuple(REGISTRY)


def head_spec(name: str) -> HeadSpec:
    """The registry's entry for ``name``; an unknown head is one clear error naming the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown head {name!r}; choose one of {HEADS}") from None
