"""Which articles a fine-tuned checkpoint has already seen, so a score on them is not taken for a
held-out one.

Fine-tuning records the articles it trained the QA model on and those it chose the no-answer
decision on (the cls threshold, or the fitted answerability's cross-fitting, whose own report lists
them); :func:`in_sample_warnings` says which of an evaluated file's articles are among them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from qa_core.squad.answerability import Answerability
from qa_core.squad.data import SquadExample

FINE_TUNED_ON = "fine_tuned_on_articles"
THRESHOLD_SELECTED_ON = "threshold_selected_on_articles"


def article_titles(examples: Iterable[SquadExample]) -> list[str]:
    return sorted({ex.title for ex in examples})


def decision_articles(metadata: Mapping[str, Any], answerability: Answerability) -> list[str]:
    """The articles the decision in use was fitted on: the fitted model's, else the cls threshold's."""
    fitted = (answerability.report.get("fitted_on") or {}).get("articles")
    if answerability.report.get("kind") != "cls" and fitted is not None:
        return list(fitted)
    return list(metadata.get(THRESHOLD_SELECTED_ON) or [])


def in_sample_warnings(
    metadata: Mapping[str, Any],
    answerability: Answerability,
    examples: Iterable[SquadExample],
    own_threshold: bool,
) -> list[str]:
    """One line for each way the evaluated questions are not held out (empty when they are)."""
    evaluated = set(article_titles(examples))
    lines = []
    trained = evaluated & set(metadata.get(FINE_TUNED_ON) or [])
    if trained:
        lines.append(
            f"{len(trained)} of the {len(evaluated)} evaluated articles were fine-tuned on: these scores are "
            "in-sample, not held out"
        )
    fitted = evaluated & set(decision_articles(metadata, answerability))
    if fitted and not own_threshold:
        lines.append(
            f"{len(fitted)} of the {len(evaluated)} evaluated articles were used to fit the no-answer "
            "decision: its F1 here is in-sample (optimistic); score it on articles it was not fitted on"
        )
    return lines
