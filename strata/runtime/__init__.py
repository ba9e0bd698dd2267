"""What a loaded model runs on: its weights (weights.py, dequantized on first use under a budget) and,
for each generating sequence, its state (state.py, with the attention KV cache of kvcache.py), the driver
that feeds it and turns logits into text (sequence.py), and why it ended (finish.py)."""
