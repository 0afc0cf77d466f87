"""The 2-hour recipe against today's recipe on the same held-out questions: span F1 (the best span on
answerable questions) per run, and each run's paired difference from the first, with 95% intervals from a
bootstrap that resamples articles, and one that resamples paragraphs (questions come in both).

    python docs/study/two-hour/compare.py EVAL_JSON NAME=EVAL_DIR NAME=EVAL_DIR ...

EVAL_JSON is the study's scored file (its eval.json); each EVAL_DIR holds a run's decisions.json.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from train.squad.metrics import compute_f1  # noqa: E402

BOOTSTRAPS = 2000


def main(eval_json: str, runs: list[str]) -> dict:
    gold, where = {}, {}
    for article in json.loads(Path(eval_json).read_text())["data"]:
        for k, paragraph in enumerate(article["paragraphs"]):
            for qa in paragraph["qas"]:
                if not qa.get("is_impossible") and qa["answers"]:
                    gold[qa["id"]] = [a["text"] for a in qa["answers"]]
                    where[qa["id"]] = (article["title"], f"{article['title']}#{k}")
    ids = sorted(gold)
    per = {}
    out: dict = {"scored_articles": sorted({w[0] for w in where.values()}), "answerable_questions": len(ids)}
    out["runs"] = {}
    for spec in runs:
        name, _, directory = spec.partition("=")
        decisions = json.loads((Path(directory) / "decisions.json").read_text())
        per[name] = 100 * np.array(
            [max(compute_f1(g, decisions[q]["best_span"] or "") for g in gold[q]) for q in ids]
        )
        by_article = {}
        for a in out["scored_articles"]:
            mask = np.array([where[q][0] == a for q in ids])
            by_article[a] = round(float(per[name][mask].mean()), 2)
        out["runs"][name] = {"span_f1": round(float(per[name].mean()), 2), "per_article": by_article}
    rng = np.random.default_rng(0)
    first = next(iter(per))
    for unit, key in (("articles", 0), ("paragraphs", 1)):
        groups: dict = {}
        for i, q in enumerate(ids):
            groups.setdefault(where[q][key], []).append(i)
        members = list(groups.values())
        counts = np.array([len(m) for m in members])
        for name in list(per)[1:]:
            diff = per[first] - per[name]
            sums = np.array([diff[m].sum() for m in members])
            picks = rng.integers(0, len(members), (BOOTSTRAPS, len(members)))
            boots = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
            low, high = np.percentile(boots, [2.5, 97.5])
            entry = out["runs"][name].setdefault(
                f"{first} minus this", {"diff": round(float(diff.mean()), 2)}
            )
            entry[f"ci95_{unit}_resampled"] = [round(float(low), 2), round(float(high), 2)]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), indent=1))
