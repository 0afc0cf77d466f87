"""SQuAD evaluation of a PyTorch QA model: features through the model in batches, decoded by the same
torch-free code the server uses (train.squad), then the official metrics; ensembles average logits."""
