"""Demonstration data: the recorder, the lossless episode format, dataset summaries and the
torch Dataset that builds frame sequences for training."""
