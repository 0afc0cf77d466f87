"""Fine-tuning settings of the original XLNet's published SQuAD 2.0 runs, as one-flag presets.

`python -m train.finetune --recipe xlnet-squad-large` sets every value below; a flag given
explicitly on the command line still wins. Each value is the original's (github zihangdai/xlnet):
the script named in `source` sets some flags, `run_squad.py`'s flag defaults give the rest.
"""

from __future__ import annotations

from typing import Any

# Shared by both published runs; the comment names the file and flag each value comes from.
_SQUAD_COMMON: dict[str, Any] = {
    "max_seq_len": 512,  # script --max_seq_length=512
    "doc_stride": 128,  # run_squad.py doc_stride default
    "max_query_len": 64,  # run_squad.py max_query_length default
    "max_answer_len": 64,  # run_squad.py max_answer_length default
    "n_best": 5,  # run_squad.py n_best_size default
    "head": "beam",  # function_builder.get_qa_outputs: the only SQuAD head of the original
    "start_n_top": 5,  # run_squad.py start_n_top default
    "end_n_top": 5,  # run_squad.py end_n_top default
    "answer_class_input": "softmax_start",  # function_builder.py, scope answer_class
    "warmup": 1000,  # script --warmup_steps=1000
    "adam_eps": 1e-6,  # script --adam_epsilon=1e-6
    "weight_decay": 0.0,  # run_squad.py weight_decay default 0.00 (so plain TF Adam)
    "optimizer": "xlnet",  # model_utils.get_train_op: tf.train.AdamOptimizer when weight_decay == 0
    "layer_decay": 0.75,  # run_squad.py lr_layer_decay_rate default
    "layer_decay_on": "gradients",  # model_utils.get_train_op multiplies the clipped gradients
    "clip": 1.0,  # run_squad.py clip default
    "decay": "linear",  # run_squad.py decay_method "poly" (power 1)
    "min_lr_ratio": 0.0,  # run_squad.py min_lr_ratio default
    "dropout": 0.1,  # run_squad.py dropout and dropatt defaults (one rate in this model)
    "eval_batch_size": 32,  # script --predict_batch_size=32
    "save_every": 1000,  # script --save_steps=1000
    # run_squad.py decides answerability by the answer class's logit against a threshold searched on
    # dev (its null_score_diff / best_f1_thresh): our cls rule. A fitted answerability model is ours,
    # so a recipe leaves it out unless the user asks for it (--answerability auto).
    "answerability": "cls",
}

RECIPES: dict[str, dict[str, Any]] = {
    "xlnet-squad-large": {
        **_SQUAD_COMMON,
        "source": "scripts/tpu_squad_large.sh (TPU v3-8, 8 cores)",
        "init_hint": "xlnet-large-cased (xlnet_cased_L-24_H-1024_A-16)",
        "published": "dev EM 86.12 (README table); F1 ~88.6 median of runs with this script (README); "
        "run_squad.py reports best_exact/best_f1, i.e. the no-answer threshold searched on dev itself",
        "global_batch_size": 48,  # --train_batch_size=48
        # 8 TPU cores x 6 windows, each core clipping its own gradient (see MicroBatchClipping):
        # ranks x micro-batches = 8 (--grad-accum defaults to 8 / ranks).
        "devices": 8,
        "clip_each_micro_batch": True,
        "lr": 3e-5,  # --learning_rate=3e-5
        "steps": 8000,  # --train_steps=8000
        "eval_every": 8000,  # do_predict once, after training
    },
    "xlnet-squad-base": {
        **_SQUAD_COMMON,
        "source": "scripts/gpu_squad_base.sh (3 GPUs x 8 windows)",
        "init_hint": "xlnet-base-cased (xlnet_cased_L-12_H-768_A-12)",
        "published": "dev EM 80.18 for XLNet-Base (README table; the script is 'one set of reasonable "
        "hyper-parameters', the README does not say it produced that number)",
        "global_batch_size": 24,  # --train_batch_size=8 per GPU x --num_core_per_host=3
        # 3 GPUs x 8 windows, each GPU's copy of get_train_op clipping its own gradient
        "devices": 3,
        "clip_each_micro_batch": True,
        "lr": 2e-5,  # --learning_rate=2e-5
        "steps": 12000,  # --train_steps=12000
        "eval_every": 12000,  # do_predict once, after training
    },
}

# Keys that describe a recipe rather than set a flag ("devices" sets --grad-accum per world size).
DESCRIPTIVE = ("source", "init_hint", "published", "devices")


def recipe_defaults(name: str) -> dict[str, Any]:
    """The argparse defaults a recipe sets (flag dest -> value)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return {k: v for k, v in RECIPES[name].items() if k not in DESCRIPTIVE}
