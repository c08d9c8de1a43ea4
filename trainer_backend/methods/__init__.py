"""Training methods: what is trainable and how it is saved."""
