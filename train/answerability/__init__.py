"""Fitting the answerability model on the training side (scikit-learn lives here and nowhere else): the
question verifier, the combining model and its calibration, the decision rules scored by cross-fitting
over whole articles, and the guard that stores answering none unless a rule credibly beats it. What is
fitted becomes plain numbers that the torch- and scikit-learn-free decoder applies (train.squad)."""
