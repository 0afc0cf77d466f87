"""The training engine shared by every recipe: one optimizer step, the loop, the optimiser, where the job runs
(seeds, DDP, precision), resumable state, run directories, what a run logs, and the session and config base
every recipe opens a run with. It never imports a recipe or an experiment."""
