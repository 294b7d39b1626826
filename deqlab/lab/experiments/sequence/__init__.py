"""Chapter 5's experiments with equilibrium sequence models (003 §4-5, 001 App. D).

One module per book experiment: the weight-tied transformer unrolled vs solved, the copy-memory
task, memory and speed of training, and a small DEQ-Transformer language model.
"""
