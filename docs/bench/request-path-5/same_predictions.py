"""Every question of a SQuAD file through a tree's host path (the server's featurizing, the shipped model's
engine, decoding with its top 10 spans listed), each prediction one JSON line: two trees' files compared
byte for byte say whether a change moved any answer, decision, probability or listed span.
``PYTHONPATH=. python docs/bench/request-path-5/same_predictions.py SQUAD.json OUT.jsonl`` from a tree's root
(same-predictions.txt: bafb992 against 4f9cb1b on the 13 shared dev articles)."""

import json
import sys
from pathlib import Path

from qa_core.squad import pad_batch
from qa_core.tokenizer import XLNetTokenizer
from server.answering.host_path import HostPath, Question
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.door.key_check import ANONYMOUS
from server.flags import load_settings

MODEL = Path("models/squad2-small-int8")


def main(squad: Path, out_path: Path) -> None:
    spec = resolve_spec(MODEL, "onnx")
    engine = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    host = HostPath.from_settings(spec, tokenizer, load_settings(["--model", str(MODEL)]))
    data = json.loads(squad.read_text())
    with out_path.open("w") as out:
        for article in data["data"]:
            for p in article["paragraphs"]:
                for qa in p["qas"]:
                    items = [Question(qa["question"], p["context"], top_k=10)]
                    groups, _, contexts = host.featurize_checked(items, ANONYMOUS)
                    rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
                    prediction = host.decode_answers(items, groups, contexts, [rows])[0][0]
                    out.write(json.dumps(prediction.to_dict()) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
