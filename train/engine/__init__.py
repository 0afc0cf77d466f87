"""The training engine shared by every recipe: one optimizer step, the loop, the optimiser, where the job runs
(seeds, DDP, precision), resumable state, run directories and what a run logs. It never imports a recipe
or an experiment."""
