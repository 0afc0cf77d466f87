"""Experiments over the recipes: the end-to-end study, the ablation grid, the fine-tuning sweep, synthetic and
hard-negative questions, and the held-out comparison of answerability rules."""
