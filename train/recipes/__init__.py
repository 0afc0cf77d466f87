"""Recipes: pretraining and fine-tuning as objects over the engine, the answerability fit, and the published
settings as presets."""
